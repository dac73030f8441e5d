#!/usr/bin/env bash
# Prepare, on a machine that reaches the package registry, what scripts/gpu_check.sh installs on a
# bare GPU machine that cannot: a wheelhouse for CPython 3.12 on manylinux x86-64 (.gpu/wheels,
# ignored by git; name it in the device call's carry).
#
#   scripts/gpu_bundle.sh [WHEELHOUSE]              # for the GPU machine's Python 3.12
#   PY_VERSION=3.11 scripts/gpu_bundle.sh .gpu/wheels-3.11   # to try gpu_check.sh here, on this Python
#
# The GPU machine's image has Python 3.12 with torch, torchvision, timm, numpy, scipy, matplotlib,
# scikit-learn, tqdm, pyyaml, pytest and pytest-xdist (docs: GPUs). It lacks hydra-core, omegaconf,
# antlr4-python3-runtime, mnist1d, the Hydra launchers and wandb: those come from here, each with
# the dependencies the image does not have. Wheels of what the image has are left out, so that
# nothing installed beside it shadows a compiled library torch was built against.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.gpu/wheels}
version=${PY_VERSION:-3.12}
abi=cp${version/./}
rm -rf "$out"
mkdir -p "$out"

# antlr4-python3-runtime 4.9.3 (what hydra-core 1.3 needs) is published only as an sdist: build
# its (pure-Python) wheel here; the resolver below finds it in the wheelhouse.
pip wheel --quiet --no-deps --wheel-dir "$out" "antlr4-python3-runtime==4.9.3"

# The versions pyproject.toml asks for, for the image's interpreter and platform.
pip download --quiet --only-binary=:all: --python-version "$version" --implementation cp --abi "$abi" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --find-links "$out" --dest "$out" \
    "hydra-core>=1.3.2,<1.4" "omegaconf>=2.3,<2.4" "mnist1d>=0.0.2" "wandb>=0.17" \
    "hydra-joblib-launcher>=1.2" "hydra-submitit-launcher>=1.2"

# What the image has already (and what those pull in): not carried.
shopt -s nullglob nocaseglob
for name in numpy scipy matplotlib contourpy kiwisolver fonttools pillow cycler pyparsing python_dateutil six \
            pyyaml joblib tzdata torch torchvision triton nvidia_ sympy mpmath networkx jinja2 markupsafe \
            filelock fsspec tqdm; do
    rm -f "$out/${name}"-*.whl "$out/${name}"*.whl
done
ls "$out" | sed 's/-[0-9].*//' | tr '\n' ' '
echo
du -sh "$out"
