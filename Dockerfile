# The Rocket Rides / unilog app image: one image for every process of the fleet (see docker-compose.yml).
#
#   docker build -t unilog-rocket-rides .
#   docker run --rm -e DATABASE_URL=... -e REDIS_URL=... unilog-rocket-rides unilog status
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONPATH=/app

WORKDIR /app

# Java for the Spark consumer, reconciliation and archive (PySpark runs a JVM)
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

# Dependencies first, in their own layer, so editing the code does not reinstall them: the runtime and `demo`
# requirements, read from pyproject.toml (all of them ship manylinux wheels, no compiler needed). `demo` names
# `unilog[embedded]` (throw-away servers for `unilog demo`): skipped here, the compose file runs real ones.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
deps = p['dependencies'] + p['optional-dependencies']['demo'] + p['optional-dependencies']['spark']; \
print('\n'.join(d for d in deps if not d.startswith('unilog')))" \
    > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Then the project. Editable, because `services/` (the demo app) is not in the wheel and is imported from /app
# (PYTHONPATH=/app, WORKDIR /app), so /app/unilog is what `import unilog` finds: the editable finder maps
# unilog.migrations onto /app/migrations (the package-dir mapping), which a plain install would not.
COPY . .
RUN pip install --no-cache-dir --no-deps -e ".[demo,spark]" \
    && python -c "import unilog.schema, services.api, services.consumer, services.migrate, services.simulator; \
print(unilog.schema.migrations_path())"

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin app
USER app

EXPOSE 5000
CMD ["gunicorn", "--bind", "0.0.0.0:5000", "--workers", "2", "--threads", "4", "services.api:app"]
