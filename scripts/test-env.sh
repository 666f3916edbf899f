#!/usr/bin/env bash
# Prepares this machine for the test suite, installing only what is missing, then runs the
# command given (make test: the Rust tests, then the Python tests).
#
#   scripts/test-env.sh CMD...
#
# - system packages (Debian, as root): gcc, make, pkg-config, Open MPI, MPICH, iproute2
#   (the tests start real mpirun/mpiexec jobs and network namespaces);
# - cargo-nextest;
# - a Python virtual environment ($HCOMM_VENV, default .venv) with maturin, pytest,
#   pytest-timeout, numpy, ml_dtypes, torch and ruff, and the hcomm package built into it
#   from python/ (an incremental release build).
# Set HCOMM_TEST_SETUP=0 to skip every installation step.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${HCOMM_VENV:-.venv}
PY_PACKAGES=(maturin pytest pytest-timeout numpy ml_dtypes torch ruff)

need_apt=()
command -v gcc >/dev/null || need_apt+=(gcc)
command -v make >/dev/null || need_apt+=(make)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v mpirun.openmpi >/dev/null || need_apt+=(openmpi-bin libopenmpi-dev)
command -v mpiexec.mpich >/dev/null || need_apt+=(mpich libmpich-dev)
command -v ip >/dev/null || need_apt+=(iproute2)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)

if [ "${HCOMM_TEST_SETUP:-1}" != 0 ]; then
  if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "test-env: installing ${need_apt[*]}" >&2
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends "${need_apt[@]}" ca-certificates >/dev/null
    else
      echo "test-env: missing ${need_apt[*]}: install them (Debian: apt-get install ${need_apt[*]})" >&2
      exit 1
    fi
  fi
  command -v cargo-nextest >/dev/null || cargo install cargo-nextest --locked
  if [ ! -x "$VENV/bin/python" ]; then
    echo "test-env: creating the virtual environment $VENV" >&2
    python3 -m venv "$VENV"
  fi
  if ! "$VENV/bin/python" -c 'import maturin, pytest, pytest_timeout, numpy, ml_dtypes, torch' 2>/dev/null \
     || [ ! -x "$VENV/bin/ruff" ]; then
    echo "test-env: installing ${PY_PACKAGES[*]} into $VENV (torch is large: minutes)" >&2
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q "${PY_PACKAGES[@]}"
  fi
  if [ -f python/pyproject.toml ]; then
    echo "test-env: building the hcomm Python package into $VENV" >&2
    VIRTUAL_ENV="$(cd "$VENV" && pwd)" PATH="$(cd "$VENV" && pwd)/bin:$PATH" \
      "$VENV/bin/maturin" develop --release --quiet -m python/Cargo.toml
  fi
fi

# Open MPI refuses to run as root unless told.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export HCOMM_VENV="$VENV"
exec "$@"
