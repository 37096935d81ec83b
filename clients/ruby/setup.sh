# Sourced by test.sh and package.sh: installs Debian's ruby (with gem), ruby-minitest and rake
# when missing. Needs the network only when something is missing.
setup_ruby() {
  local pkgs=(ruby ruby-rubygems ruby-minitest rake) missing=() p sudo=""
  for p in "${pkgs[@]}"; do
    if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" != "installed" ]]; then
      missing+=("$p")
    fi
  done
  if (( ${#missing[@]} )); then
    if [[ "$(id -u)" != 0 ]]; then sudo="sudo"; fi
    $sudo apt-get update -qq -o DPkg::Lock::Timeout=600
    $sudo apt-get install -y -qq --no-install-recommends --no-upgrade -o DPkg::Lock::Timeout=600 "${missing[@]}"
  fi
}
