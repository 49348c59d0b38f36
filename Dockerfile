# The floorguard guard as a container: `docker build -t floorguard .`
# Runs `floorguard serve --config /etc/floorguard/guard.yaml` as an unprivileged user; mount
# the config there (deploy/kubernetes/configmap.yaml) and pass secrets as environment
# variables (identity.jwt.secret_env, admin.token_env). Ports: 8080 the guard, 9464 admin.
FROM python:3.11-slim AS build
# a C compiler: setup.py compiles the core with mypyc (without one it installs the pure
# core, which behaves the same, slower); the runtime stage carries no compiler
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY src ./src
RUN pip install --no-cache-dir --prefix=/install ".[tokenizer]" \
    && PYTHONPATH=/install/lib/python3.11/site-packages python -c "from floorguard._compiled import running; r = running(); print('core:', r); assert r.startswith('compiled'), r"

FROM python:3.11-slim
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin floorguard \
    && mkdir -p /var/log/floorguard \
    && chown 10001 /var/log/floorguard
COPY --from=build /install /usr/local
USER 10001
EXPOSE 8080 9464
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["floorguard", "serve"]
CMD ["--config", "/etc/floorguard/guard.yaml"]
