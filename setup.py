from setuptools import find_packages, setup

from pathlib import Path

version = {}
exec((Path(__file__).parent / "miyamoto" / "version.py").read_text(), version)

setup(
    name="miyamoto",
    version=version["__version__"],
    description="A clustered webhook task queue server",
    license="MIT",  # LICENSE
    long_description=(Path(__file__).parent / "README").read_text(),
    long_description_content_type="text/markdown",
    packages=find_packages(exclude=["tests", "tests.*"]),
    # the dashboard's page, script and style (miyamoto/http/dashboard.py serves them)
    package_data={"miyamoto.http": ["static/*.html", "static/*.js", "static/*.css"]},
    python_requires=">=3.11",
    install_requires=[
        "gevent>=24.2",
        "pyzmq>=26.0",
        "requests>=2.31",
        "ujson>=5.9",
        "geventhttpclient>=2.3",
        "httptools>=0.6",  # miyamoto/delivery/httpclient.py: the delivery client's answer parser
        "tqdm>=4.66",  # the CLI's progress bar for enqueue --file
        "prometheus_client>=0.20",
        "croniter>=2.0",  # schedules: cron expressions (miyamoto.definitions.schedules)
        "tzdata>=2024.1",  # schedules: IANA time zones where the OS has none
        # miyamoto/delivery/identity.py: OIDC tokens (RS256/ES256) and Ed25519 v1a signatures
        "cryptography>=41.0",
        "PyJWT>=2.8",
    ],
    extras_require={
        "test": [
            "pytest>=8.0",
            "pytest-timeout>=2.3",
            "hypothesis>=6.100",
            "pytest-xdist>=3.5",
            "openapi-spec-validator>=0.7",  # tests/unit/http/test_openapi.py: the spec is valid 3.1
            "schemathesis>=4.0",  # tests/nodes/test_openapi_node.py: a bounded run against a node
            # tests/nodes/test_openapi_generators.py: a generated client against a node
            "openapi-python-client>=0.29",
            "matplotlib>=3.8",  # tests/nodes/test_bench_plot.py: scripts/bench.py --plot
            "playwright>=1.40",  # tests/nodes/test_dashboard_browser.py drives Debian's chromium
            "podman-compose>=1.1",  # tests/nodes/test_containers.py brings compose.yaml up
            "kubernetes-validate>=1.30",  # tests/unit/test_deploy.py: the manifests' schema
            "build>=1.0",  # tests/nodes/test_release.py: python -m build, wheel and sdist
            # tests/unit/test_tracing.py: the SDK's in-memory exporter
            "opentelemetry-api>=1.20", "opentelemetry-sdk>=1.20",
            # tests/nodes/test_qstash_node.py: QStash's own SDK (and its Receiver) against nodes
            "qstash>=3.0",
            # tests/nodes/test_cloudtasks_sdk.py: Google's SDK (REST transport) against nodes
            "google-cloud-tasks>=2.26",  # the version tested; older ones pin protobuf<5
            # tests/unit/delivery/test_attempt.py, tests/nodes/test_identity_node.py: the
            # reference HMAC receiver accepts a header that also carries v1a
            "standardwebhooks>=1.0",
        ],
        # traces (miyamoto/tracing.py): tracing = true, or OTEL_EXPORTER_OTLP_ENDPOINT
        "otel": ["opentelemetry-api>=1.20", "opentelemetry-sdk>=1.20",
                 "opentelemetry-exporter-otlp-proto-http>=1.20"],
        "plot": ["matplotlib>=3.8"],  # scripts/bench.py --plot FILE (latency PNG)
        # scripts/celery_compare.py (plus Debian's redis-server); not needed by the tests
        "compare": ["celery>=5.3", "redis>=5.0"],
    },
    entry_points={"console_scripts": ["miyamoto = miyamoto.cli.main:main"]},
)
