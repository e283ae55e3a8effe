#!/usr/bin/env bash
# The GPU section of bench/RESULTS.md in one command, on a Linux x86-64 machine with an NVIDIA GPU,
# CUDA-enabled PyTorch and pytest in its python3 (run from the repository root):
#
#   bash bench/gpu_setup.sh [--out DIR] [--no-tests] [--no-bench] [-- ARGS FOR bench.gpu]
#
# 1. wheels: the packages the GPU path needs beyond that python (NVRx 0.7, what the trainer expects on
#    CUDA, and the versions of its imports that NVRx 0.7 asks for; list below) are taken from .whl/ where
#    they are there, else downloaded into it (needs a package index; `bash bench/gpu_setup.sh --download`
#    does only this, on any machine that reaches one, for a GPU machine that does not);
# 2. install: ftplane itself, built from this checkout, with those wheels: README's line for a GPU
#    machine, `pip install '.[gpu]'`, as it can run here. Into $SITE (default /tmp/ftplane-gpu-site) with
#    pip --target, put first on PYTHONPATH (ftplane-agent and ft_launcher on PATH). It cannot run as
#    written: the machine has no package index (the build backend, setuptools and wheel, comes from .whl/
#    too), and resolving the extra's requirements would take a second torch into $SITE, or upgrade the
#    machine's own packages, where the machine's CUDA torch must be kept and nothing installed into it.
#    So the extra is installed as its resolution for this machine: torch, numpy and httpx are the
#    machine's, the rest the pinned wheels, with --no-deps;
# 3. the CUDA tests (tests/trainer/nvrx/test_cuda.py, marked `cuda`; and test_versions.py beside it, the
#    version guard, against NVRx 0.7): DIR/cuda-tests.log, DIR/cuda-tests.xml;
# 4. bench/gpu.py with the parameters of the recorded run (BENCH_ARGS below; replaced by the arguments
#    after `--`): DIR/bench/ (results.json, gpu.log, sections.log, metrics).
#
# The exit status is the tests' (then the benchmark's) first failure. Everything printed also goes to
# DIR/gpu_setup.log. On one H200 it takes about 15 minutes (tests ~4, the benchmark ~11; the parts'
# times added up).
set -uo pipefail

PY_VERSION=${PY_VERSION:-3.12}
SITE=${SITE:-/tmp/ftplane-gpu-site}
WHEELS_DIR=${WHEELS_DIR:-.whl}
OUT=${OUT:-bench-gpu-out}
# pinned, one version each (pip --no-deps installs exactly these)
WHEELS=(
    nvidia-resiliency-ext==0.7.0 # the trainer's NVRx on CUDA (pyproject's `gpu` extra: ~=0.7.0)
    grpcio==1.76.0               # NVRx 0.7.0's generated gRPC/protobuf code asks for these
    protobuf==6.31.1
    defusedxml==0.7.1            # imported by NVRx 0.7.0's ft_launcher
    pydantic==2.14.4             # NVRx 0.7.0's settings (pydantic-settings) and its imports
    pydantic-core==2.50.5
    pydantic-settings==2.16.3
    python-dotenv==1.2.4
    annotated-types==0.8.0
    typing-inspection==0.4.5
    typing-extensions==4.16.0
)
# ftplane's build backend (pyproject's [build-system]), for building the checkout without an index
BUILD_WHEELS=(setuptools==84.2.1 wheel==0.45.1) # neither has dependencies of its own
# What bench/RESULTS.md's `## gpu` records: blocking (sync and NVRx, 3 saves each), efficiency over one
# checkpoint interval of 540 steps of the `large` model, recovery (in-process and in-job) of `medium`.
BENCH_ARGS=(--sections env,blocking,efficiency,recovery --engines sync,nvrx_async --saves 3
    --interval-steps 540 --intervals 1 --skip 10 --recovery-model medium --fault-step 30 --budget-s 1500)

download_only=0 tests=1 bench=1
while [ $# -gt 0 ]; do
    case "$1" in
    --download) download_only=1 ;;
    --out) OUT=$2; shift ;;
    --no-tests) tests=0 ;;
    --no-bench) bench=0 ;;
    --) shift; BENCH_ARGS=("$@"); break ;;
    *) echo "unknown argument $1 (see the head of $0)" >&2; exit 2 ;;
    esac
    shift
done

have_wheels() {
    local spec name version
    for spec in "${WHEELS[@]}" "${BUILD_WHEELS[@]}"; do
        name=${spec%%==*} version=${spec##*==}
        compgen -G "$WHEELS_DIR/${name//-/_}-${version}-*.whl" >/dev/null || return 1
    done
}

download() {
    mkdir -p "$WHEELS_DIR"
    # manylinux tags up to 2_39 (NVRx 0.7.0's wheel is manylinux_2_39); pip matches each tag exactly
    local platforms=() n
    for n in 17 27 28 31 34 35 39; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
        --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 --platform any \
        -d "$WHEELS_DIR" "${WHEELS[@]}" "${BUILD_WHEELS[@]}"
}

if [ "$download_only" = 1 ]; then
    download && have_wheels && echo "wheels for python $PY_VERSION in $WHEELS_DIR/"
    exit
fi

mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_setup.log") 2>&1
commit='?'
[ -e .git ] && commit=$(git rev-parse --short HEAD 2>/dev/null)
echo "== $(date -u +%FT%TZ) ftplane $commit on $(hostname)"
have_wheels || download || { echo "no wheels in $WHEELS_DIR/ and no index to download them from" >&2; exit 3; }
# pip builds `.` in an isolated environment, its build backend from --find-links (--no-index holds there too)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    --find-links "$WHEELS_DIR" . "${WHEELS[@]}" || exit 3
# `python3 -m` from the repository root finds tests/ and bench/ (and this checkout's ftplane) first
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1
python3 - <<'EOF' || exit 4
import importlib.metadata as md, torch
assert torch.cuda.is_available(), "no CUDA device: this script is for a GPU machine"
print("python", __import__("sys").version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "gpu", torch.cuda.get_device_name(0), "nvidia-resiliency-ext", md.version("nvidia-resiliency-ext"))
EOF

status=0
if [ "$tests" = 1 ]; then
    echo "== CUDA tests"
    # --confcutdir: only tests/trainer's conftest (the suite's top one needs the control plane's packages)
    python3 -m pytest -p no:cacheprovider --confcutdir=tests/trainer \
        tests/trainer/nvrx/test_cuda.py tests/trainer/nvrx/test_versions.py \
        -v -rA --log-level=WARNING -o junit_family=xunit1 --junitxml="$OUT/cuda-tests.xml" 2>&1 |
        tee "$OUT/cuda-tests.log"
    status=${PIPESTATUS[0]}
fi
if [ "$bench" = 1 ]; then
    echo "== bench/gpu.py ${BENCH_ARGS[*]}"
    python3 -m bench.gpu --out "$OUT/bench" "${BENCH_ARGS[@]}" || [ "$status" != 0 ] || status=$?
fi
echo "== done: exit $status"
exit "$status"
