# The floorguard guard as a container: `docker build -t floorguard .`
# Runs `floorguard serve --config /etc/floorguard/guard.yaml` as an unprivileged user; mount
# the config there (deploy/kubernetes/configmap.yaml) and pass secrets as environment
# variables (identity.jwt.secret_env, admin.token_env). Ports: 8080 the guard, 9464 admin.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir --prefix=/install ".[tokenizer]"

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
