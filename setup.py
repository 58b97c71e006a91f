"""Maps the top-level component folders into the `radixserve` namespace.

`operator/` cannot be a top-level package (the standard library's `operator` is loaded at
interpreter start-up), so every component folder is installed as `radixserve.<name>`.
"""

from setuptools import find_packages, setup

COMPONENTS = {"engine": "engine", "kernels": "kernels", "router": "router", "operator": "operator"}


def _packages() -> tuple[list[str], dict[str, str]]:
    packages = ["radixserve", *(f"radixserve.{p}" for p in find_packages("radixserve"))]
    package_dir = {"radixserve": "radixserve"}
    for name, folder in COMPONENTS.items():
        root = f"radixserve.{name}"
        package_dir[root] = folder
        packages += [root, *(f"{root}.{p}" for p in find_packages(folder))]
    return packages, package_dir


PACKAGES, PACKAGE_DIR = _packages()
setup(
    packages=PACKAGES, package_dir=PACKAGE_DIR, package_data={"radixserve.operator": ["**/*.yaml"]}
)
