# LoongForge: `make demo` (main job) and `make test` (every test) on a fresh Debian 12 machine.
# Both install missing apt packages, configure and build first.

PY        ?= /usr/bin/python3
BUILD     ?= build
CUDA      ?= AUTO
JOBS      ?= $(shell nproc)
DEMO_DIR  ?= demo_out
APT_PKGS  := build-essential cmake git pkg-config liblmdb-dev lmdb-utils libturbojpeg0-dev \
             libjpeg62-turbo-dev libxxhash-dev libzstd-dev pybind11-dev python3-dev \
             python3-numpy python3-torch python3-torchvision python3-pil python3-pytest \
             libgtest-dev libopenmpi-dev openmpi-bin nlohmann-json3-dev libcli11-dev \
             python3-lmdb python3-matplotlib libopenblas0-openmp libsnappy-dev zlib1g-dev \
             libavformat-dev libavcodec-dev libswscale-dev libavutil-dev ffmpeg \
             python3-pip python3-venv
SUDO      := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export PYTHONPATH := $(CURDIR)/python:$(PYTHONPATH)

.PHONY: all deps configure build test test-cpp test-python demo bench-loader wheel format clean

all: build

# Installs only what is missing, so repeated runs do not touch apt.
deps:
	@missing=$$(for p in $(APT_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | \
	  grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DLOONGFORGE_CUDA=$(CUDA) \
	  -DPython3_EXECUTABLE=$(PY)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

test-python: build
	$(PY) -m pytest -q -p no:cacheprovider tests/python

test: test-cpp test-python

# Through bin/loongforge, the entry point the README uses.
demo: build
	LOONGFORGE_BUILD=$(abspath $(BUILD)) LOONGFORGE_PYTHON=$(PY) bin/loongforge demo --out $(DEMO_DIR)

bench-loader: build
	$(PY) bench/loader/run.py --cli $(BUILD)/loongforge

# dist/loongforge-*.whl for $(PY), packed from this build (tools/pep517; nothing from any index).
wheel: build
	LOONGFORGE_BUILD_DIR=$(abspath $(BUILD)) $(PY) -m pip wheel --no-index --no-deps -w dist .

format:
	clang-format -i $$(git ls-files '*.h' '*.cc' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD) python/loongforge/_C*.so
