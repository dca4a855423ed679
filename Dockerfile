# One image for every service of the stack; docker-compose.yml picks the service with its command:
#   concierge serve <service> --host 0.0.0.0
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 concierge \
    && useradd --system --uid 10001 --gid concierge --home-dir /app --shell /usr/sbin/nologin concierge

WORKDIR /app

# Dependencies in their own layer: read from pyproject.toml alone, so editing the source does not reinstall them.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The project itself, without touching the dependencies installed above.
COPY README.md ./
COPY resilience ./resilience
COPY infra ./infra
COPY graph ./graph
COPY agents ./agents
COPY recovery ./recovery
RUN pip install --no-deps . \
    && mkdir -p /app/.concierge \
    && chown -R concierge:concierge /app/.concierge

ENV CONCIERGE_DATA_DIR=/app/.concierge

USER concierge

EXPOSE 8000 8001 8002 8010 8011 8020

# The default command runs the booking-agent; docker-compose.yml overrides command and healthcheck per service.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"]

CMD ["concierge", "serve", "booking-agent", "--host", "0.0.0.0"]
