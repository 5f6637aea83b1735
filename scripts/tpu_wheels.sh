#!/usr/bin/env bash
# Downloads, into .whl-tpu/ (or DIR), the wheels cpplan's runtime needs on a TPU VM that has jax,
# jaxlib, libtpu, numpy and scipy but no internet: flax, optax, orbax-checkpoint, tensorstore,
# tensorboardX, protobuf, tqdm, grain, array-record, safetensors and what they need beyond jax's own stack.
# The versions are those the project is tested with (Python 3.11, jax 0.10.2). On the VM:
#   python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir \
#       --upgrade --target "$SITE" .whl-tpu/*.whl
#   export PYTHONPATH=$PYTHONPATH:$SITE   (appended: the VM's own jax stays first)
# (benchmarks/tpu_v5e.sh does both when it finds .whl-tpu/). Usage: scripts/tpu_wheels.sh [DIR]
set -euo pipefail

DIR="${1:-.whl-tpu}"
PIP="${PIP:-python3 -m pip}"
# one version of each: two of a package, or a wheel for another Python, stop the whole install
WHEELS=(
  flax==0.12.8 optax==0.2.8 orbax-checkpoint==0.12.8 tensorstore==0.1.86 tensorboardX==2.6.5
  protobuf==7.36.2 tqdm==4.70.1 grain==0.2.18 array-record==0.8.6
  absl-py==2.5.1 aiofiles==25.1.0 cloudpickle==3.1.3 etils==1.15.0 fsspec==2026.9.0 humanize==4.17.0
  markdown-it-py==4.3.0 mdurl==0.1.2 msgpack==1.2.4 packaging==26.4 portpicker==1.6.0
  prometheus-client==0.26.0 psutil==7.2.2 pygments==2.21.0 pyyaml==6.0.4 rich==15.0.0 simplejson==4.3.0
  treescope==0.1.10 typing-extensions==4.16.0 uvloop==0.23.0 zipp==4.1.2 safetensors==0.8.0
)
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 \
  manylinux_2_24_x86_64 manylinux_2_31_x86_64; do
  PLATFORMS+=(--platform "$p")
done

mkdir -p "$DIR"
for wheel in "${WHEELS[@]}"; do
  $PIP download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp "${PLATFORMS[@]}" \
    -d "$DIR" "$wheel"
done
echo "$(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR"
