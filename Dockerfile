# syntax=docker/dockerfile:1
#
# Archer's container image, for both architectures from one build host:
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse --short=12 HEAD) \
#     -t ghcr.io/archer-dev/archer:0.1.0 --push .
#
# The build stage runs on the build host's own platform ($BUILDPLATFORM) and cross-compiles for
# each target platform with Debian's cross toolchain, so no stage runs under emulation. The
# runtime stage is distroless: glibc, libgcc, CA certificates (the registry client trusts the
# system's roots) and the nonroot user 65532; no shell, no package manager.
#
# The Helm chart (deploy/helm/archer/templates/deployment.yaml) and deploy/base/deployment.yaml run
# this image as user 65532 with runAsNonRoot and a read-only root filesystem, and pass only
# `args: [serve, --config=...]`: the entrypoint is the binary, and the image needs nothing
# writable (the serving certificate and the config are mounted volumes).
#
# The local equivalent, which pulls no base image, is tests/e2e/build-image.

ARG VERSION=""
ARG REVISION=""

FROM --platform=$BUILDPLATFORM rust:1.95-bookworm AS build
ARG TARGETARCH
ARG BUILDARCH

# The cross linker and C compiler for ring and mimalloc (both compile C through the cc crate),
# only when the target is not the build host's own architecture.
RUN set -eu; \
    if [ "$TARGETARCH" != "$BUILDARCH" ]; then \
      case "$TARGETARCH" in \
        arm64) pkgs="gcc-aarch64-linux-gnu libc6-dev-arm64-cross" ;; \
        amd64) pkgs="gcc-x86-64-linux-gnu libc6-dev-amd64-cross" ;; \
        *) echo "unsupported TARGETARCH $TARGETARCH" >&2; exit 1 ;; \
      esac; \
      apt-get update; \
      apt-get install -y --no-install-recommends $pkgs; \
      rm -rf /var/lib/apt/lists/*; \
    fi; \
    case "$TARGETARCH" in \
      amd64) echo x86_64-unknown-linux-gnu ;; \
      arm64) echo aarch64-unknown-linux-gnu ;; \
      *) echo "unsupported TARGETARCH $TARGETARCH" >&2; exit 1 ;; \
    esac > /rust-target; \
    rustup target add "$(cat /rust-target)"

# Native builds find `cc`; cross builds use the prefixed toolchain (Debian's gcc also installs
# x86_64-linux-gnu-gcc on amd64 and aarch64-linux-gnu-gcc on arm64, so these hold either way).
ENV CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=x86_64-linux-gnu-gcc \
    CC_x86_64_unknown_linux_gnu=x86_64-linux-gnu-gcc \
    AR_x86_64_unknown_linux_gnu=x86_64-linux-gnu-ar \
    CARGO_TERM_COLOR=never

WORKDIR /src
# The build context is limited by .dockerignore (no target/, no .git).
COPY . .

# build.rs reads ARCHER_GIT_REVISION and `archer --version` prints it. .git is not in the build
# context: without REVISION the revision is "unknown".
# The registry is shared by both platforms' builds (cargo locks it); the target directory is one
# per architecture, so the two builds run side by side. The binary is copied out of the cache
# mount, which is not part of the stage's filesystem. It keeps the release profile's line tables
# (Cargo.toml: [profile.release] debug = 1) for readable backtraces.
ARG VERSION
ARG REVISION
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target,id=archer-target-$TARGETARCH \
    set -eu; \
    triple="$(cat /rust-target)"; \
    ARCHER_GIT_REVISION="${REVISION:-unknown}" \
      cargo build --release --locked --bin archer --target "$triple"; \
    mkdir -p /out; \
    cp "target/$triple/release/archer" /out/archer

FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION
ARG REVISION
LABEL org.opencontainers.image.source="https://github.com/archer-dev/archer" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.title="archer" \
      org.opencontainers.image.description="Architecture-aware placement for mixed amd64/arm64 Kubernetes clusters: admission webhook, scheduler extender, provisioner" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=build --chown=0:0 --chmod=0755 /out/archer /archer
USER 65532:65532
# No CMD: the chart and the manifests give the subcommand (`serve`) as args.
ENTRYPOINT ["/archer"]
