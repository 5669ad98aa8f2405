# Sourced (not run) by the test scripts tests/c/run.sh and tests/fork/run.sh, from the
# repository's root: a heading per step, the release library built for linking, stages that
# record a failure and let the next stages run, and the summary that ends the script.

step() { printf '\n=== %s\n' "$*"; }

# build_library: build the release library (cargo), and set LDFLAGS to link a test program
# against it (found at run time through its rpath: no LD_LIBRARY_PATH needed).
build_library() {
    step "cargo build --release"
    cargo build --release
    LDFLAGS=(-L target/release -lump_alloc "-Wl,-rpath,$PWD/target/release")
}

failures=()

# stage NAME COMMAND...: run one stage with its heading and its time; a failing stage is
# recorded and the next stages still run.
stage() {
    local name="$1"
    shift
    step "$name"
    local t0=$SECONDS
    if ! "$@"; then
        echo "!!! FAILED: $name"
        failures+=("$name")
    fi
    echo "($((SECONDS - t0)) s)"
}

# finish MESSAGE: exit 1 listing the failed stages, if any; else print MESSAGE.
finish() {
    if ((${#failures[@]})); then
        step "FAILED: ${#failures[@]} problem(s)"
        printf '  - %s\n' "${failures[@]}"
        exit 1
    fi
    step "$1"
}
