set -uo pipefail
export OUT=${OUT:-/tmp/out}
eval "$(bash tools/gpu-deps.sh unpack)" >/dev/null 2>&1
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOONGFORGE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DPython3_EXECUTABLE=$(command -v python3) -Dpybind11_DIR=$(python3 -m pybind11 --cmakedir) > $OUT/cfg.log 2>&1 || { tail -20 $OUT/cfg.log; exit 1; }
cmake --build build-gpu -j16 > $OUT/build.log 2>&1 || { grep -B2 -A10 error $OUT/build.log | head -60; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
PYTHONPATH=python timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rfs tests/python/test_graphs.py 2>&1 | tail -25
echo "tests $(( $(date +%s)-t0 )) s"
ROWS=${ROWS:-eager,syncfree,graphs} BATCHES=${BATCHES:-16} STEPS=${STEPS:-20} WARMUP=${WARMUP:-8} timeout ${ABL_T:-300} bash bench/e2e/ablation.sh $OUT 2>&1 | tail -30
echo "total $(( $(date +%s)-t0 )) s"
