# The Rocket Rides / unilog app image: one image for every process of the fleet (see docker-compose.yml).
#
#   docker build -t unilog-rocket-rides .
#   docker run --rm -e DATABASE_URL=... -e REDIS_URL=... unilog-rocket-rides unilog status
#
# PYTHON_IMAGE picks the base (the compose file passes ${PYTHON_IMAGE}; a stand-in built from Debian's packages
# where no registry is reachable, docs/guides/compose.md). SPARK=0 leaves out Java and the spark extra (about 700 MB)
# for a fleet without the Spark consumer, as the Podman test runs it.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}
ARG SPARK=1

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONPATH=/app

WORKDIR /app

# Java for the Spark consumer, reconciliation and archive (PySpark runs a JVM)
RUN if [ "$SPARK" = 1 ]; then apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*; fi

# Dependencies first, in their own layer, so editing the code does not reinstall them: the runtime, `demo` and
# `dashboard` (Flask and waitress) requirements, read from pyproject.toml (all of them ship wheels, no compiler
# needed). `demo` names `unilog-outbox[embedded]` (throw-away servers for `unilog demo`): skipped here, the compose
# file runs real ones; and `unilog-outbox[contracts]` (pydantic, for the demo's typed records): its own requirements
# are taken instead. (unilog-outbox is this project's distribution: the project's own name, p['name'].)
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
extra = p['optional-dependencies']; deps = p['dependencies'] + extra['demo'] + extra['contracts'] + extra['dashboard'] \
+ (extra['spark'] if '$SPARK' == '1' else []); \
print('\n'.join(d for d in deps if not d.startswith(p['name'])))" \
    > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Then the project. Editable, because `services/` (the demo app) is not in the wheel and is imported from /app
# (PYTHONPATH=/app, WORKDIR /app), so /app/unilog is what `import unilog` finds: the editable finder maps
# unilog.migrations onto /app/migrations (the package-dir mapping), which a plain install would not.
COPY . .
RUN pip install --no-cache-dir --no-deps -e . \
    && python -c "import unilog.ops.schema, services.api, services.consumer, services.migrate, services.simulator; \
print(unilog.ops.schema.migrations_path())"

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin app
USER app

EXPOSE 5000
CMD ["gunicorn", "--bind", "0.0.0.0:5000", "--workers", "2", "--threads", "4", "services.api:app"]
