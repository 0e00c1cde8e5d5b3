#!/usr/bin/env bash
# smg's own PD end-to-end tests (e2e_test/router/test_pd_*.py), unchanged, against pdchaos's fake vLLM engines
# through the vLLM shim, with smg from PyPI. Nothing in the smg checkout is changed: only the environment,
# PYTHONPATH and the Python the tests run under come from outside it.
#
#   examples/smg-e2e/run.sh SMG_CHECKOUT [PYTEST_ARGS...]
#
# It runs smg's CI legs of e2e-2gpu-pd for vLLM, one pytest session each: E2E_VLLM_KV_BACKEND=nixl, then
# mooncake (E2E_ENGINE=vllm, E2E_RUNTIME=vllm, E2E_GPU_TIER=2). PYTEST_ARGS replace the default test
# selection (e2e_test/router/test_pd_*.py). Exit status: pytest's (the first leg that did not pass), or 3
# when the environment could not be set up.
#
# Environment (all optional):
#   SMG_VERSION        smg from PyPI (default 1.13.0)
#   SMG_E2E_HOME       where the venv, smg's client and the runs go (default ~/.cache/pdchaos/smg-e2e)
#   SMG_E2E_VENV       the venv the tests run in (default $SMG_E2E_HOME/venv-smg-$SMG_VERSION; made if absent)
#   SMG_E2E_RUN_DIR    this run's logs and junit files (default $SMG_E2E_HOME/runs/<time>)
#   SMG_E2E_LEGS       the KV backends to run (default "nixl mooncake")
#   SMG_CLIENT_TYPES   smg_client's generated types (_generated.py) to use; else see below
#   PDCHAOS_PYTHON     the Python with pdchaos's dependencies (default this tree's .venv/bin/python)
#
# smg's conftest imports smg_client, whose types smg's CI generates (`make generate-clients`: a cargo build of
# openapi-gen, then datamodel-codegen). In order: SMG_CLIENT_TYPES; the checkout's own generated types; a
# generation as smg's Makefile does it (needs cargo and crates.io); else the types smg once committed
# (23caf6ee2, 2026-02), read from the checkout's git history.
set -uo pipefail

die() { echo "run.sh: $*" >&2; exit 3; }
[ $# -ge 1 ] || die "usage: $0 SMG_CHECKOUT [PYTEST_ARGS...]"
SMG=$(cd "$1" 2>/dev/null && pwd) || die "no such folder: $1"
shift
[ -d "$SMG/e2e_test/router" ] || die "$SMG is not a checkout of smg (no e2e_test/router)"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

SMG_VERSION=${SMG_VERSION:-1.13.0}
HOME_DIR=${SMG_E2E_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/pdchaos/smg-e2e}
VENV=${SMG_E2E_VENV:-$HOME_DIR/venv-smg-$SMG_VERSION}
RUN_DIR=${SMG_E2E_RUN_DIR:-$HOME_DIR/runs/$(date +%Y%m%d-%H%M%S)}
LEGS=${SMG_E2E_LEGS:-nixl mooncake}
PDCHAOS_PYTHON=${PDCHAOS_PYTHON:-$ROOT/.venv/bin/python}
mkdir -p "$HOME_DIR" "$RUN_DIR" || die "cannot write $HOME_DIR"

# pdchaos's Python: the shim hands each engine over to it (PDCHAOS_SHIM_PYTHON).
(cd "$ROOT" && "$PDCHAOS_PYTHON" -c "import fake_engines.cli, pdchaos.ports") 2>/dev/null \
    || die "$PDCHAOS_PYTHON cannot import pdchaos (set PDCHAOS_PYTHON)"
SHIM=$(cd "$ROOT" && "$PDCHAOS_PYTHON" -c "from harness.vllm.cli import shim_folder; print(shim_folder())") \
    || die "cannot find pdchaos's vLLM shim"

# The tests' venv: smg from PyPI and what e2e_test imports. Its python3 comes first on PATH, so the
# suite's `python3 -m smg.launch_router` is this smg.
if ! "$VENV/bin/python" -c "import smg, pytest, openai, anthropic" 2>/dev/null; then
    echo "run.sh: making $VENV (smg==$SMG_VERSION and e2e_test's dependencies)"
    "${SMG_E2E_BASE_PYTHON:-python3}" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "e2e_test needs Python 3.11 or later (enum.StrEnum); set SMG_E2E_BASE_PYTHON"
    "${SMG_E2E_BASE_PYTHON:-python3}" -m venv "$VENV" || die "cannot make $VENV"
    "$VENV/bin/pip" install -q "smg==$SMG_VERSION" anthropic grpcio grpcio-health-checking httpx jinja2 \
        numpy openai pandas pytest pytest-rerunfailures requests tqdm pyyaml pydantic \
        || die "pip install into $VENV failed"
fi
have=$("$VENV/bin/python" -c "from importlib.metadata import version; print(version('smg'))")
[ "$have" = "$SMG_VERSION" ] || die "$VENV has smg $have, not $SMG_VERSION (remove it or set SMG_E2E_VENV)"

# smg_client, with its generated types, on PYTHONPATH (outside the checkout).
COMMIT=$(git -C "$SMG" rev-parse --short HEAD 2>/dev/null || echo unknown)
CLIENT=$HOME_DIR/client-$COMMIT
GEN=$CLIENT/smg_client/types/_generated.py
if [ -f "$SMG/clients/python/smg_client/types/_generated.py" ] && [ -z "${SMG_CLIENT_TYPES:-}" ]; then
    CLIENT=$SMG/clients/python
    TYPES="the checkout's own"
elif [ -z "${SMG_CLIENT_TYPES:-}" ] && [ -f "$GEN" ] && [ -f "$CLIENT/types.txt" ]; then
    TYPES="$(cat "$CLIENT/types.txt") (made earlier in $CLIENT)"
else
    rm -rf "$CLIENT" && mkdir -p "$CLIENT" && cp -r "$SMG/clients/python/smg_client" "$CLIENT/" \
        || die "cannot copy smg_client"
    if [ -n "${SMG_CLIENT_TYPES:-}" ]; then
        cp "$SMG_CLIENT_TYPES" "$GEN" || die "cannot read SMG_CLIENT_TYPES=$SMG_CLIENT_TYPES"
        TYPES="$SMG_CLIENT_TYPES"
    elif command -v cargo >/dev/null \
        && (cd "$SMG" && CARGO_TARGET_DIR="$HOME_DIR/target" cargo run -q -p openapi-gen -- "$CLIENT/openapi.yaml") \
            >"$CLIENT/generate.log" 2>&1 \
        && "$VENV/bin/pip" install -q "datamodel-code-generator==0.54.0" >>"$CLIENT/generate.log" 2>&1 \
        && "$VENV/bin/datamodel-codegen" --input "$CLIENT/openapi.yaml" --input-file-type openapi \
            --output "$GEN" --output-model-type pydantic_v2.BaseModel --use-annotated --field-constraints \
            --target-python-version 3.10 --collapse-root-models --use-standard-collections \
            --use-union-operator >>"$CLIENT/generate.log" 2>&1; then
        sed -i 's/class \(.*\)(Enum):/class \1(str, Enum):/' "$GEN"
        TYPES="generated from $COMMIT (cargo run -p openapi-gen, datamodel-codegen 0.54.0)"
    elif git -C "$SMG" show 23caf6ee2:clients/python/smg_client/types/_generated.py >"$GEN" 2>/dev/null; then
        # As smg's Makefile post-processes them since: str enums (`status == "completed"` holds).
        sed -i 's/class \(.*\)(Enum):/class \1(str, Enum):/' "$GEN"
        TYPES="smg's committed types of 23caf6ee2 (2026-02; no cargo build here: see $CLIENT/generate.log)"
    else
        die "no smg_client types: run \`make generate-clients\` in $SMG, or set SMG_CLIENT_TYPES"
    fi
    echo "$TYPES" >"$CLIENT/types.txt"
fi
(cd /tmp && PYTHONPATH="$CLIENT" "$VENV/bin/python" -c "from smg_client import SmgClient") \
    || die "smg_client does not import from $CLIENT"

echo "run.sh: smg $SMG_VERSION ($VENV), smg checkout $SMG at $COMMIT, smg_client types: $TYPES"
echo "run.sh: fake engines through $SHIM under $PDCHAOS_PYTHON; logs in $RUN_DIR"

if [ $# -gt 0 ]; then TESTS=("$@"); else TESTS=($(cd "$SMG" && echo e2e_test/router/test_pd_*.py)); fi
status=0
for leg in $LEGS; do
    out=$RUN_DIR/$leg
    mkdir -p "$out/logs"
    echo "run.sh: leg $leg: pytest ${TESTS[*]}"
    (
        cd "$SMG" || exit 3
        env E2E_ENGINE=vllm E2E_RUNTIME=vllm E2E_GPU_TIER=2 E2E_VLLM_KV_BACKEND="$leg" \
            E2E_LOG_DIR="$out/logs" SHOW_WORKER_LOGS=0 CI=true \
            PATH="$VENV/bin:$PATH" PYTHONPATH="$SHIM:$CLIENT" PYTHONDONTWRITEBYTECODE=1 \
            PDCHAOS_SHIM_PYTHON="$PDCHAOS_PYTHON" PDCHAOS_ENGINES_REGISTRY="$out/engines.json" \
            "$VENV/bin/python" -m pytest -p no:cacheprovider -rA --junitxml="$out/junit.xml" "${TESTS[@]}"
    ) 2>&1 | tee "$out/pytest.log"
    rc=${PIPESTATUS[0]}
    echo "run.sh: leg $leg: pytest exit $rc (junit $out/junit.xml)"
    if [ "$status" -eq 0 ] && [ "$rc" -ne 0 ]; then status=$rc; fi
done
exit "$status"
