# The Miyamoto node image. Build:
#   podman build --format docker -t miyamoto .          (docker build -t miyamoto . too)
# BASE is any image with python3 (3.11 or later) and its venv module: the usual slim Python
# image by default; the tests build on a Debian base made with mmdebstrap (README, Deploy).
# INSTALL is what pip installs: the source in the context by default; a build without the
# package index passes wheels (a context holding wheels/, made by `pip wheel . -w wheels`):
#   --build-arg INSTALL="--no-index --find-links /src/wheels miyamoto"
ARG BASE=docker.io/library/python:3.11-slim-bookworm

FROM ${BASE} AS build
ARG INSTALL=/src
COPY . /src
# pip and setuptools leave the venv after the install: the final stage has no build tools
RUN python3 -m venv /opt/miyamoto \
 && /opt/miyamoto/bin/pip install --no-cache-dir --disable-pip-version-check ${INSTALL} \
 && /opt/miyamoto/bin/pip uninstall -q -y pip setuptools \
 && find /opt/miyamoto -name __pycache__ -prune -exec rm -rf {} + \
 && /opt/miyamoto/bin/python -m compileall -q /opt/miyamoto/lib

FROM ${BASE}
# a dedicated user (no login, no home beyond /data) owns the journal and nothing else
RUN useradd --system --uid 10001 --user-group --home-dir /data --no-create-home \
        --shell /usr/sbin/nologin miyamoto \
 && mkdir -p /data \
 && chown miyamoto:miyamoto /data \
 && chmod 0700 /data
COPY --from=build /opt/miyamoto /opt/miyamoto
# Containers listen on every address, so the API needs tokens (MIYAMOTO_API_TOKENS, or
# insecure_http=true out loud): without them the node exits 2 naming api_tokens. Keys and
# tokens come from the environment (MIYAMOTO_CURVE_PUBLIC, MIYAMOTO_CURVE_SECRET,
# MIYAMOTO_API_TOKENS, MIYAMOTO_SIGNING_SECRET) or a mounted INI file (MIYAMOTO_CONFIG).
ENV PATH=/opt/miyamoto/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MIYAMOTO_DATA_DIR=/data \
    MIYAMOTO_HTTP=0.0.0.0:8088 \
    MIYAMOTO_CLUSTER=tcp://0.0.0.0:6000
USER miyamoto:miyamoto
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8088 6000
# the stop signal `miyamoto serve` drains on (deliveries get shutdown_timeout, 10 s)
STOPSIGNAL SIGTERM
# /readyz on the node's own HTTP address (MIYAMOTO_HTTP; 0.0.0.0 is asked as 127.0.0.1)
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["/opt/miyamoto/bin/python", "-c", "import os, urllib.request; h, _, p = os.environ.get('MIYAMOTO_HTTP', '127.0.0.1:8088').rpartition(':'); h = '127.0.0.1' if h in ('0.0.0.0', '', '[::]') else h; urllib.request.urlopen(f'http://{h}:{p}/readyz', timeout=2)"]
# exec form: the node is PID 1 and gets SIGTERM itself (hand-off and drain, as `miyamoto serve`)
ENTRYPOINT ["/opt/miyamoto/bin/miyamoto"]
CMD ["serve"]
