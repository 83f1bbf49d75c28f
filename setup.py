"""Build script: package metadata lives here with the cffi extension it builds.

`pip install -e .` compiles beast/native (C, cffi API mode) through
`cffi_modules`, so the native queue is always built for the interpreter that
runs it.
"""

from setuptools import find_packages, setup

# mujoco 4.0.0 reports a solver bug fixed in 4.0.1; stay on 3.x.
MUJOCO = ["gymnasium[mujoco]>=1.0", "mujoco>=3,<4"]
# The API and settings beast drives (env_seed, gray_scale, use_inter_area_resize).
ENVPOOL = "envpool>=1.2.5,<1.3"
# --wandb (beast/outputs/wandb_log.py), checked with 0.31: a 20 MB wheel, 56 MB installed (its Go
# core included), plus OpenTelemetry and httpx (about 2 MB).
WANDB = ["wandb>=0.31"]
# python -m beast.export --format onnx and running its files (beast/export.py): torch's
# dynamo ONNX exporter needs onnxscript; checked with onnx 1.23, onnxruntime 1.32 and
# onnxscript 0.7 (about 120 MB installed, 78 of them onnxruntime's).
EXPORT = ["onnx>=1.23", "onnxruntime>=1.32", "onnxscript>=0.7"]

setup(
    name="beast",
    version="0.1.0",
    description=(
        "A PyTorch engine for scalable deep RL: IMPALA, LASER, R2D2, Ape-X, PPO, A2C as plug-ins."
    ),
    python_requires=">=3.10",
    packages=find_packages(include=["beast", "beast.*"]),
    # The packages sit in the project's root, said explicitly: setuptools then installs
    # an editable copy (`pip install -e .`) as a path entry for this folder in a .pth file,
    # not as its default import hook, which runs after the path search. With the hook, a
    # folder named beast in the working directory (the clone itself, seen from its parent,
    # or any unrelated one) is imported as an empty namespace package in place of beast;
    # on the path, the real package, a regular one, wins over a namespace portion found
    # before it (tests/end_to_end/test_install.py).
    package_dir={"": "."},
    setup_requires=["cffi>=1.15"],
    cffi_modules=["beast/native/build.py:ffibuilder"],
    install_requires=[
        "torch>=2.6,<3",  # fused Adam on CPU, nn.utils.get_total_norm
        "numpy>=1.24",
        "gymnasium>=1.0",
        "ale-py>=0.9",
        "opencv-python-headless>=4.8",
        "gitpython>=3.1",
        "cffi>=1.15",
        "pyyaml>=6.0",  # configs/*.yaml, sweep files, the run's config.yaml
        "tensorboard>=2.14",  # event files through torch.utils.tensorboard
        "rich>=13",  # the live progress bar on a terminal
        "matplotlib>=3.7",  # beast.plot, sweep plots
    ],
    extras_require={
        "test": [
            "pytest>=7",
            # The default suite runs on 2 workers (pyproject.toml: -n 2); -n 0 runs it in one.
            "pytest-xdist>=3.5",
            # The shuffled-order check (`-p randomly`, off by default: pyproject.toml).
            "pytest-randomly>=3.15",
            "ruff>=0.5",
            "imageio>=2.30",
            "imageio-ffmpeg>=0.4.9",
            "ray>=2.60,<3",
            "optuna>=4.2,<6",  # tests/tune/test_tune.py
            *MUJOCO,
            *WANDB,  # tests/outputs/test_wandb.py's offline run
            *EXPORT,  # tests/trained/test_export.py's ONNX files
            # tests/envs/test_envpool_batch.py: the envpool backend against the loop. Its
            # wheels are ~300 MB to download and ~740 MB installed (below).
            ENVPOOL,
        ],
        # polybeast.py: Ray 2.x (an ~80 MB wheel; its other dependencies are mostly
        # already here). tests/poly/test_polybeast.py skips itself without it.
        "ray": ["ray>=2.60,<3"],
        # The Optuna search of `python -m beast.sweep` (beast/tune/optuna_search.py).
        "tune": ["optuna>=4.2,<6"],
        # --record_video: imageio-ffmpeg ships its own ffmpeg binary (no system ffmpeg),
        # but its wheel is ~70 MB, so it is opt-in.
        "video": ["imageio>=2.30", "imageio-ffmpeg>=0.4.9"],
        # HalfCheetah-v5 and the other MuJoCo tasks: the mujoco wheel carries the simulator.
        "mujoco": MUJOCO,
        # --env_backend envpool: EnvPool's C++ thread pool for Atari and MuJoCo, with its
        # own ALE, ROMs and MuJoCo (1.2.5 on Python 3.11: wheels of 53 MB plus 243 MB of
        # assets of its other suites, 740 MB installed; checked against beast's
        # preprocessing by tests/envs/test_envpool_batch.py). In "test" too, so that CI runs
        # the backend: without it those tests that need EnvPool skip themselves.
        "envpool": [ENVPOOL],
        # --wandb: Weights & Biases logging, online or offline.
        "wandb": WANDB,
        # ONNX export (TorchScript needs nothing more than torch).
        "export": EXPORT,
        # benchmarks/races.py and the sb3_*_side_by_side scripts: the peers of the
        # learner-bound algorithms, run beside beast, in the versions compared against:
        # SB3 2.9.2 and SBX 0.28 (SB3's API over jax-jitted updates). SBX brings jax with
        # its CPU jaxlib, flax, optax and tfp-nightly: about 400 MB installed, 357 of them
        # jaxlib's. rliable is not here: 1.2.0 needs arch < 8, and arch 7.2 fails to import
        # with pandas 3; benchmarks/atari.py implements its IQM and stratified bootstrap.
        "bench": ["stable-baselines3>=2.9,<3", "sbx-rl>=0.28,<0.29", *MUJOCO],
    },
    zip_safe=False,
)
