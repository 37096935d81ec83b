# Sourced by test.sh and package.sh (bash): setup_venv makes clients/python/.venv (gitignored) on a
# fresh machine (Debian 12, Python 3.11) with the tools of pyproject.toml's dependency group "dev"
# (pytest, mypy, build, twine, setuptools) and the package itself. It reaches the registry only for
# what is missing: once done, building and testing run offline.
setup_venv() {
    # Debian packages: openssl (test certificates are made at test time), python3-venv where the
    # system Python lacks venv. apt only when something is missing.
    local need=()
    command -v openssl >/dev/null 2>&1 || need+=(openssl)
    "${PYTHON:-python3}" -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
    if [ ${#need[@]} -gt 0 ] && ! dpkg-query -W "${need[@]}" >/dev/null 2>&1; then
        apt-get update
        apt-get install -y --no-install-recommends --no-upgrade -o DPkg::Lock::Timeout=600 "${need[@]}"
    fi
    if [ ! -x .venv/bin/python ]; then
        "${PYTHON:-python3}" -m venv .venv
    fi
    local pip=(.venv/bin/python -m pip --disable-pip-version-check)
    # Before 0.3.0 the distribution was named "ticketing" (a name another project holds in the
    # registry); remove it so that two distributions do not own the same files.
    if "${pip[@]}" show ticketing >/dev/null 2>&1; then
        "${pip[@]}" uninstall --yes --quiet ticketing
    fi
    local dev
    mapfile -t dev < <(.venv/bin/python -c 'import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["dependency-groups"]["dev"]))')
    "${pip[@]}" install --quiet "${dev[@]}"
    # The build backend is the venv's setuptools (installed just above): no isolated build env.
    "${pip[@]}" install --quiet --no-build-isolation --no-deps .
}
