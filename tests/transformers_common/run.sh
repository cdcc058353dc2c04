#!/usr/bin/env bash
# transformers' common model tests (ModelTesterMixin) on Fastformer, from the source distribution of the installed
# transformers, run there as transformers runs its own models' tests:
#   bash tests/transformers_common/run.sh [work folder] [pytest arguments...]
# It downloads that distribution (PyPI) and installs `parameterized`, which its tests import. The distribution does
# not ship tests/exporters/ and tests/generation/, which test_modeling_common.py imports: both are stood in for by
# empty mixins, so the export and generation tests are not run (the project's suite tests both).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:-$(mktemp -d)}"
shift || true
version="$(python -c 'import transformers; print(transformers.__version__)')"
root="$work/transformers-$version"
if [ ! -d "$root" ]; then
    pip download --quiet --no-binary :all: --no-deps "transformers==$version" -d "$work"
    tar xzf "$work/transformers-$version.tar.gz" -C "$work"
fi
pip install --quiet parameterized
mkdir -p "$root/tests/exporters" "$root/tests/generation" "$root/tests/models/fastformer"
for folder in tests tests/exporters tests/generation tests/models tests/models/fastformer; do
    touch "$root/$folder/__init__.py"
done
[ -f "$root/tests/exporters/test_export.py" ] || echo "class ExportTesterMixin: ..." > "$root/tests/exporters/test_export.py"
[ -f "$root/tests/generation/test_utils.py" ] || echo "class GenerationTesterMixin: ..." > "$root/tests/generation/test_utils.py"
cp "$here/modeling_fastformer_common.py" "$root/tests/models/fastformer/test_modeling_fastformer.py"
cd "$root"
python -m pytest tests/models/fastformer -p no:cacheprovider -rs -q "$@"
