# inboxd in a container: `docker build -t inboxd .` then
#   docker run -p 8080:8080 -v inboxd-data:/var/lib/inboxd --ulimit memlock=-1 inboxd
# (--ulimit memlock=-1 lets it lock the store and its own code in memory: server.lock_cache
# and server.lock_code in README.)
# The first start creates the store and prints the owner's API key (once) on stdout.
FROM python:3.11-slim

RUN useradd --system --home-dir /var/lib/inboxd --shell /usr/sbin/nologin inboxd \
    && mkdir -p /var/lib/inboxd /etc/inboxd && chown inboxd:inboxd /var/lib/inboxd

WORKDIR /opt/inboxd
COPY pyproject.toml README.md ./
COPY .ci/constraints.txt ./constraints.txt
COPY inboxd ./inboxd
# The versions CI last passed with (.ci/constraints.txt).
RUN pip install --no-cache-dir . -c constraints.txt && rm -rf /root/.cache
COPY config/inboxd.toml /etc/inboxd/inboxd.toml

ENV INBOXD_DATA=/var/lib/inboxd \
    INBOXD_SERVER_BIND=0.0.0.0:8080 \
    PYTHONUNBUFFERED=1
VOLUME ["/var/lib/inboxd"]
EXPOSE 8080
USER inboxd
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=3s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/readyz', timeout=2)"
ENTRYPOINT ["inboxd"]
CMD ["serve", "--config", "/etc/inboxd/inboxd.toml"]
