"""A loopback stand-in for the Hugging Face Hub, for tests that push and download with the real clients.

`serve()` serves it on 127.0.0.1 (a free port) from a daemon thread and yields a `RunningHub`: its `url`, to be
the clients' endpoint, and its `store`; tests reach it through tests/conftest.py's `hub` and `hub_server` fixtures.
A repo keeps every commit as an immutable snapshot of all its files (commit id -> files) and branches that point at
commits, `main` at the latest, so a test can see what a push added, replaced and kept. Like the Hub, creating a
repo makes an "initial commit" holding `.gitattributes`.

huggingface_hub reads its endpoint (`HF_ENDPOINT`) once, at import, and transformers' `from_pretrained` and
`push_to_hub` always use that module-level endpoint (only `HfApi(endpoint=...)` and `hf_hub_download(endpoint=...)`
take another), so run the clients in a subprocess with `hub.client_env(hf_home)`.

Routes, model repos only: what huggingface_hub 2.4 and transformers 5.24 call for `create_repo`, `upload_folder`,
`create_commit`, `create_branch`, `list_repo_commits`, `list_repo_tree`, `get_paths_info`, `push_to_hub`,
`from_pretrained` and `hf_hub_download`:

    POST     /api/repos/create                      409 with the repo's url when it exists (exist_ok=True passes)
    POST     /api/validate-yaml                     a README.md's front matter must be a YAML mapping
    GET      /api/whoami-v2
    GET      /api/models/{repo}[/revision/{rev}]    model info with `sha` and `siblings`
    POST     /api/models/{repo}/preupload/{rev}     every file "regular" (no LFS, no Xet), with the oid it has now
    POST     /api/models/{repo}/commit/{rev}        NDJSON: header, file (base64), deletedFile, deletedFolder
    POST     /api/models/{repo}/branch/{branch}     409 when it exists
    GET      /api/models/{repo}/commits/{rev}       newest first
    GET      /api/models/{repo}/tree/{rev}[/{dir}]  `recursive=true` for the whole subtree
    POST     /api/models/{repo}/paths-info/{rev}
    GET|HEAD /{repo}/resolve/{rev}/{path}           X-Repo-Commit, ETag (the git blob oid), Content-Length

Errors carry the Hub's `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound), which the client turns into
its exceptions. Writes need a bearer token (any); a private repo is invisible without one. Any other route answers
501 and is recorded in `store.unknown_routes`.
"""

import base64
import contextlib
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Mapping, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

USER = "user"  # whoami, and the namespace of a repo created without one
TOKEN = "hf_loopback_test_token"  # what client_env gives the clients; the server takes any
GITATTRIBUTES = b"*.bin filter=lfs diff=lfs merge=lfs -text\n*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
REPO_API = re.compile(
    r"/api/models/(?P<repo>[^/]+/[^/]+)"
    r"(?:/(?P<action>revision|preupload|commit|branch|commits|tree|paths-info)/(?P<rev>[^/]+)(?:/(?P<path>.*))?)?"
)
RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)")


def git_blob_oid(content: bytes) -> str:
    """The id git gives a file's content, which the client compares with its own to skip unchanged files."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class HubError(Exception):
    def __init__(self, status, message, code=None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


@dataclass(frozen=True)
class Commit:
    oid: str
    parent: str | None
    title: str
    description: str
    date: str
    files: Mapping[str, bytes]  # every file of the repo at this commit, read-only


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit oid

    def resolve(self, revision) -> Commit:
        """The commit a branch name or commit oid points at."""
        commit = self.commits.get(self.branches.get(revision, revision))
        if commit is None:
            raise HubError(404, f"Revision {revision!r} not found in {self.repo_id}", "RevisionNotFound")
        return commit

    def history(self, revision="main") -> list[Commit]:
        """Commits reachable from `revision`, oldest first."""
        commits = [self.resolve(revision)]
        while commits[-1].parent is not None:
            commits.append(self.commits[commits[-1].parent])
        return commits[::-1]

    def commit(self, branch, title, description, files) -> Commit:
        """Makes `files` (all of them, not a change) the next commit on `branch`."""
        # random, so that no two servers' commits share an id: clients cache files by commit id
        oid = os.urandom(20).hex()
        date = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
        parent = self.branches.get(branch)
        self.commits[oid] = Commit(oid, parent, title, description, date, MappingProxyType(dict(files)))
        self.branches[branch] = oid
        return self.commits[oid]


class Request(NamedTuple):
    method: str
    path: str
    token: str | None


class HubStore:
    """The server's repos, and a log of the requests it got. Handlers hold `lock` while they read or write."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.unknown_routes: list[str] = []
        self.lock = threading.Lock()

    def repo(self, repo_id, token=None) -> Repo:
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and token is None):
            raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
        return repo

    def history(self, repo_id, revision="main") -> list[Commit]:
        return self.repos[repo_id].history(revision)

    def files(self, repo_id, revision="main") -> Mapping[str, bytes]:
        return self.repos[repo_id].resolve(revision).files

    def create_repo(self, repo_id, private) -> Repo:
        repo = self.repos[repo_id] = Repo(repo_id, private)
        repo.commit("main", "initial commit", "", {".gitattributes": GITATTRIBUTES})
        return repo


def tree_entry(path, files):
    """The tree listing's entry for a file or folder `path` among `files`, or None if there is none."""
    if path in files:
        return {"type": "file", "path": path, "oid": git_blob_oid(files[path]), "size": len(files[path])}
    below = sorted(name for name in files if name.startswith(path + "/"))
    if not below:
        return None
    tree_oid = hashlib.sha1("\n".join(f"{name} {git_blob_oid(files[name])}" for name in below).encode()).hexdigest()
    return {"type": "directory", "path": path, "oid": tree_oid, "size": 0}


def front_matter_errors(readme):
    """Why the Hub would refuse this README.md's YAML metadata: it must be a mapping."""
    match = re.match(r"---\n(.*?)\n---(\n|$)", readme, re.DOTALL)
    if match is None:
        return []
    try:
        metadata = yaml.safe_load(match.group(1))
    except yaml.YAMLError as error:
        return [f"Invalid YAML in README.md: {error}"]
    return [] if metadata is None or isinstance(metadata, dict) else ["README.md metadata must be a YAML mapping"]


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every answer carries Content-Length

    def do_GET(self):
        self.dispatch()

    def do_HEAD(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    def do_PUT(self):
        self.dispatch()

    def do_DELETE(self):
        self.dispatch()

    def log_message(self, format, *args):  # quiet: the store keeps the request log
        pass

    def dispatch(self):
        store = self.server.store
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        self.body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        authorization = self.headers.get("Authorization", "")
        self.token = authorization.removeprefix("Bearer ") if authorization.startswith("Bearer ") else None
        with store.lock:
            store.requests.append(Request(self.command, url.path, self.token))
            try:
                self.route(url.path)
            except HubError as error:
                self.send_error_json(error.status, error.message, error.code)
            except Exception as error:  # a request this server misreads: tell the client rather than hang up
                self.send_error_json(500, f"tests/hub_server.py failed on {self.command} {self.path}: {error!r}")

    def route(self, path):
        store, method = self.server.store, self.command
        if (method, path) == ("POST", "/api/repos/create"):
            return self.create_repo()
        if (method, path) == ("POST", "/api/validate-yaml"):
            errors = front_matter_errors(json.loads(self.body)["content"])
            return self.send_json({"errors": [{"message": e} for e in errors], "warnings": []}, 400 if errors else 200)
        if (method, path) == ("GET", "/api/whoami-v2"):
            self.require_token()
            return self.send_json({"type": "user", "name": USER, "fullname": USER, "orgs": []})
        if match := REPO_API.fullmatch(path):
            repo = store.repo(unquote(match["repo"]), self.token)
            action, revision = match["action"], unquote(match["rev"] or "main")
            dir_path = unquote(match["path"] or "").strip("/")
            handler = {
                ("GET", None): self.model_info,
                ("GET", "revision"): self.model_info,
                ("POST", "preupload"): self.preupload,
                ("POST", "commit"): self.commit,
                ("POST", "branch"): self.create_branch,
                ("GET", "commits"): self.list_commits,
                ("GET", "tree"): self.tree,
                ("POST", "paths-info"): self.paths_info,
            }.get((method, action))
            if handler is not None and (dir_path == "" or action == "tree"):
                return handler(repo, revision, dir_path)
        if method in ("GET", "HEAD") and (match := RESOLVE.fullmatch(path)):
            repo = store.repo(unquote(match["repo"]), self.token)
            return self.resolve(repo.resolve(unquote(match["rev"])), unquote(match["path"]))
        store.unknown_routes.append(f"{method} {self.path}")
        raise HubError(501, f"tests/hub_server.py does not serve {method} {self.path}")

    def require_token(self):
        if self.token is None:
            raise HubError(401, "Invalid credentials in Authorization header: this needs a token")

    def create_repo(self):
        store = self.server.store
        self.require_token()
        payload = json.loads(self.body)
        if payload.get("type", "model") != "model":
            raise HubError(400, "tests/hub_server.py serves model repos only")
        repo_id = f"{payload.get('organization') or USER}/{payload['name']}"
        url = f"{self.server.url}/{repo_id}"
        if repo_id in store.repos:
            return self.send_json({"error": "You already created this model repo", "url": url}, 409)
        store.create_repo(repo_id, private=payload.get("visibility", "public") != "public")
        self.send_json({"url": url, "name": repo_id, "id": repo_id})

    def model_info(self, repo, revision, _):
        commit = repo.resolve(revision)
        self.send_json(
            {
                "_id": repo.repo_id,
                "id": repo.repo_id,
                "author": repo.repo_id.split("/")[0],
                "sha": commit.oid,
                "lastModified": commit.date,
                "createdAt": repo.history(revision)[0].date,
                "private": repo.private,
                "disabled": False,
                "gated": False,
                "tags": [],
                "siblings": [{"rfilename": name} for name in sorted(commit.files)],
            }
        )

    def preupload(self, repo, revision, _):
        self.require_token()
        files = repo.resolve(revision).files
        answer = []
        for file in json.loads(self.body)["files"]:
            oid = git_blob_oid(files[file["path"]]) if file["path"] in files else None
            answer.append({"path": file["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": oid})
        self.send_json({"files": answer})

    def commit(self, repo, branch, _):
        self.require_token()
        if "create_pr" in self.query:
            raise HubError(400, "tests/hub_server.py does not open pull requests")
        if branch not in repo.branches:
            raise HubError(404, f"Branch {branch!r} not found in {repo.repo_id}", "RevisionNotFound")
        lines = [json.loads(line) for line in self.body.decode().splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        if header.get("parentCommit") not in (None, repo.branches[branch]):
            raise HubError(412, f"{branch} has moved on from parent commit {header['parentCommit']}")
        files = dict(repo.resolve(branch).files)
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, f"{value['path']}: only base64 file contents are supported")
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                files.pop(value["path"], None)
            elif key == "deletedFolder":
                files = {name: data for name, data in files.items() if not name.startswith(value["path"] + "/")}
            elif key != "header":
                raise HubError(400, f"tests/hub_server.py does not take {key!r} commit operations (LFS, copies)")
        commit = repo.commit(branch, header["summary"], header.get("description", ""), files)
        url = f"{self.server.url}/{repo.repo_id}/commit/{commit.oid}"
        self.send_json({"success": True, "commitOid": commit.oid, "commitUrl": url})

    def create_branch(self, repo, branch, _):
        self.require_token()
        if branch in repo.branches:
            raise HubError(409, f"Branch {branch!r} already exists")
        start = json.loads(self.body or b"{}").get("startingPoint") or "main"
        repo.branches[branch] = repo.resolve(start).oid
        self.send_json({})

    def list_commits(self, repo, revision, _):
        self.send_json(
            [
                {"id": c.oid, "title": c.title, "message": c.description, "date": c.date, "authors": [{"user": USER}]}
                for c in repo.history(revision)[::-1]
            ]
        )

    def tree(self, repo, revision, dir_path):
        files = repo.resolve(revision).files
        prefix = dir_path + "/" if dir_path else ""
        below = [name[len(prefix) :] for name in files if name.startswith(prefix)]
        if dir_path and not below:
            raise HubError(404, f"{dir_path} not found at {revision}", "EntryNotFound")
        if self.query.get("recursive") == ["true"]:
            parts = [name.split("/") for name in below]
            paths = {"/".join(names[:depth]) for names in parts for depth in range(1, len(names) + 1)}
        else:
            paths = {name.split("/")[0] for name in below}
        self.send_json([tree_entry(prefix + path, files) for path in sorted(paths)])

    def paths_info(self, repo, revision, _):
        files = repo.resolve(revision).files
        entries = (tree_entry(path.strip("/"), files) for path in parse_qs(self.body.decode()).get("paths", []))
        self.send_json([entry for entry in entries if entry is not None])

    def resolve(self, commit, path):
        if path not in commit.files:
            raise HubError(404, f"{path} not found at {commit.oid}", "EntryNotFound")
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{git_blob_oid(commit.files[path])}"'}
        self.send(commit.files[path], 200, "application/octet-stream", headers)

    def send_error_json(self, status, message, code=None):
        # a header value must be one line of latin-1
        headers = {"X-Error-Message": message.encode("ascii", "backslashreplace").decode().replace("\n", " ")}
        if code is not None:
            headers["X-Error-Code"] = code
        self.send_json({"error": message}, status, headers)

    def send_json(self, payload, status=200, headers=None):
        self.send(json.dumps(payload).encode(), status, "application/json", headers or {})

    def send(self, body, status, content_type, headers):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


@dataclass
class RunningHub:
    url: str  # http://127.0.0.1:<port>, the clients' endpoint
    store: HubStore

    def client_env(self, hf_home, token=TOKEN):
        """Environment for a subprocess that runs huggingface_hub / transformers against this server: no inherited
        Hugging Face settings (HF_HUB_OFFLINE, which refuses every request, caches, tokens; add back what you need,
        e.g. HF_DATASETS_OFFLINE=1), its own cache under `hf_home`, no proxy for loopback. `token=None` leaves the
        client anonymous."""
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))
        }
        env.update(
            HF_ENDPOINT=self.url,
            HF_HOME=str(hf_home),
            HF_HUB_DISABLE_TELEMETRY="1",
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
        )
        if token is not None:
            env["HF_TOKEN"] = token
        return env


@contextlib.contextmanager
def serve(lifetime_s=600):
    """Serves a fresh store on a free loopback port; stops on exit, or after `lifetime_s` whatever happens."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubHandler)
    server.daemon_threads = True
    server.store = HubStore()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="hub-server", daemon=True)
    deadline = threading.Timer(lifetime_s, server.shutdown)
    deadline.daemon = True
    thread.start()
    deadline.start()
    try:
        yield RunningHub(server.url, server.store)
    finally:
        deadline.cancel()
        server.shutdown()
        server.server_close()
        thread.join()
