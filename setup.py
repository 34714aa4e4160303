from setuptools import find_packages, setup

setup(
    name="nat-plugins",
    version="0.1.0",
    description="fairseq plugins for fast (non-/semi-autoregressive) neural machine translation decoding",
    packages=find_packages(include=["nat_plugins", "nat_plugins.*"]),
    python_requires=">=3.10",
    # fairseq-fixed and torch are installed by run_scripts/setup_env.sh in a fixed order (DESIGN.md §3):
    # pip cannot express --no-build-isolation/--no-deps here, so they are not listed as requirements.
    install_requires=["sacrebleu>=2.0", "sentencepiece", "matplotlib"],
    extras_require={"align": ["eflomal==2.0.0"]},
    entry_points={
        "console_scripts": [
            "nat-distill=nat_plugins.cli.distill:cli_main",
            "nat-benchmark=nat_plugins.cli.benchmark:cli_main",
            "nat-fertility=nat_plugins.cli.fertility:cli_main",
        ]
    },
)
