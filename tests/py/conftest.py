import os
import pathlib
import shlex

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# DEEPINFER_BIN: run the tests against another build (make test-asan uses the ASan one)
BIN = pathlib.Path(os.environ.get("DEEPINFER_BIN", ROOT / "build" / "deepinfer"))


def load_tool(name):
    """tools/<name>.py as a module (the analysis scripts have no package to import them from)"""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
TOKENIZERS = {
    "v3": ROOT.parent / "shared" / "tokenizers" / "deepseek-v3" / "tokenizer.json",
    "v4": ROOT / "assets" / "tokenizers" / "deepseek-v4" / "tokenizer.json",
}


@pytest.fixture(scope="session")
def deepinfer():
    if not BIN.exists():
        pytest.fail(f"{BIN} not built: run `make build` first")
    return str(BIN)


@pytest.fixture(scope="module")
def parse_cmd(request):
    """the command the stream diff tests run `recipe parse` with: DEEPINFER_PARSE_CMD (e.g. a reference script, to
    check the harness itself) or build/deepinfer"""
    env = os.environ.get("DEEPINFER_PARSE_CMD")
    if env:
        return shlex.split(env)
    return [request.getfixturevalue("deepinfer")]
