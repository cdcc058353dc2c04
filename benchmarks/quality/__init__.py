"""The paper's findings at small scale on real data (docs/RESULTS.md)."""
