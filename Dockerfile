# One image for every service of the stack; docker-compose.yml picks the service with its command:
#   concierge serve <service> --host 0.0.0.0
# The base image is a build argument only so that `make compose-check` can build on a machine that cannot pull it
# (scripts/compose_check.py passes a local stand-in); everyone else gets the official image.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 concierge \
    && useradd --system --uid 10001 --gid concierge --home-dir /app --shell /usr/sbin/nologin concierge

WORKDIR /app

# Dependencies in their own layer, exactly as locked (requirements.lock: `make lock`; every file checked against its
# hash), so editing the source does not reinstall them and a rebuild next month installs what was tested today.
# The lock also pins the build backend, which builds the project below without fetching anything.
COPY requirements.lock ./
RUN pip install --no-deps --require-hashes -r requirements.lock \
    && rm requirements.lock

# The project itself: every package pyproject.toml names, without touching the dependencies installed above.
COPY pyproject.toml README.md ./
COPY stack ./stack
COPY agents ./agents
COPY providers ./providers
COPY recovery ./recovery
COPY runs ./runs
COPY graph ./graph
COPY infra ./infra
COPY identity ./identity
COPY process ./process
COPY errors ./errors
COPY domain ./domain
COPY resilience ./resilience
COPY examples ./examples
RUN pip install --no-deps --no-build-isolation . \
    && pip check \
    && rm -rf build *.egg-info \
    && mkdir -p /app/.concierge /issuer \
    && chown -R concierge:concierge /app/.concierge /issuer

# The only places the service writes: CONCIERGE_DATA_DIR (SQLite checkpoints when DATABASE_URL is unset, `concierge`
# CLI state) and /issuer, where docker-compose.yml mounts the local people's issuer (a new volume takes the owner of
# the image's directory, so the non-root `issuer` service can write its key pair there).
ENV CONCIERGE_DATA_DIR=/app/.concierge

USER concierge

EXPOSE 8000 8001 8002 8010 8011 8020

# The default command runs the booking-agent; docker-compose.yml overrides command and healthcheck per service.
# `concierge serve` is PID 1 (exec form, no shell): SIGTERM from `docker stop` reaches uvicorn, whose graceful
# shutdown runs the service's drain (the booking-agent's handoff).
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"]

CMD ["concierge", "serve", "booking-agent", "--host", "0.0.0.0"]
