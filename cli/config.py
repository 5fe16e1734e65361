"""Every ``DINREC_*`` variable dinrec reads, in one reference.

The settings classes are the source: each field of each class is one variable (its env prefix + the
field's name), with the field's type, default and description. A few variables are read outside
them (by the kernel cache, the spot job's shell script, the local services and the tests); they are
listed in :data:`OTHER_VARIABLES`. ``dinrec config`` prints the reference (``docs/configuration.md``
is that output, checked by a test), and every command warns about a ``DINREC_*`` variable that none
of them knows, naming the closest known one: the settings classes forbid unknown keywords, but an
environment variable no field reads would otherwise be dropped without a word.
"""

from __future__ import annotations

import difflib
import enum
import typing
from collections.abc import Mapping
from pathlib import Path

from pydantic import SecretStr
from pydantic_settings import BaseSettings

from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.models.ranking_settings import RankingSettings
from dinrec.retrain.settings import RetrainSettings
from dinrec.serving.settings import ServingSettings
from dinrec.spot.settings import SpotSettings
from dinrec.storage.settings import SharedSettings
from dinrec.streams.settings import StreamSettings
from dinrec.training.settings import TrainSettings

PREFIX = "DINREC_"

# (title, the settings class, the commands that read it)
COMPONENTS: tuple[tuple[str, type[BaseSettings], str], ...] = (
    ("Shared by every process", SharedSettings, "serve, ingest, demo, retrain, models"),
    ("Event stream", StreamSettings, "serve, ingest, demo, bench"),
    ("Online store and ingestion", FeatureStoreSettings, "serve, ingest, demo, retrain, bench"),
    ("The served list", RankingSettings, "serve, train, retrain, demo, simulate, bench"),
    ("Serving", ServingSettings, "serve, demo, simulate, bench"),
    ("Training", TrainSettings, "train, retrain, spot run, demo"),
    ("Retraining", RetrainSettings, "retrain"),
    ("Spot jobs", SpotSettings, "spot, retrain --spot, plan"),
)

# What a deployment must set, in the order an operator meets it: name → (an example value, why). The
# defaults are the laptop's (embedded store and stream, models in a folder, anyone may name any user);
# a deployment that leaves these at their defaults runs, and loses data or trust.
MUST_SET: dict[str, tuple[str, str]] = {
    "DINREC_STORE": ("redis", "the embedded store lives and dies with one process: redis or redis-cluster"),
    "DINREC_REDIS_URL": ("redis://redis:6379/0", "where it is (its maxmemory-policy must be noeviction)"),
    "DINREC_STREAM": ("kafka", "the in-process stream reaches no other process: kafka"),
    "DINREC_KAFKA_BOOTSTRAP": ("kafka:9092", "where it is"),
    "DINREC_TOPIC_REPLICATION": ("3", "topics dinrec creates survive a broker (min.insync.replicas 2)"),
    "DINREC_OUTBOX_DIR": ("/var/lib/dinrec/outbox", "events accepted while Kafka is away wait here: a volume that "
                          "outlives the pod"),
    "DINREC_REGISTRY": ("s3://models/registry", "where versions and aliases live: every replica follows the alias, "
                        "retrain publishes to it"),
    "DINREC_HOST": ("0.0.0.0", "the address the API binds (loopback by default)"),
    "DINREC_USER_HEADER": ("x-user-id", "the header your gateway sets to the authenticated user: without it, on a "
                           "non-loopback address the service refuses to start (DINREC_ANONYMOUS_USERS opts out)"),
    "DINREC_ADMIN_TOKEN": ("(from a secret: openssl rand -hex 32)", "enables /admin/* (reload, rollback, "
                           "experiments); unset: admin off"),
    "DINREC_EXPERIMENTS_FILE": ("s3://models/control/experiments.json", "the A/B experiments (on S3: every change is "
                                "compare-and-swap); unset: none"),
    "DINREC_RETRAIN_ARCHIVE_DIR": ("s3://models/archive", "the event archive `dinrec ingest archive` writes and "
                                   "retrain trains on"),
    "DINREC_SPOT_STATE_URI": ("s3://models/spot", "spot jobs only: their state and checkpoints, where a relaunched "
                              "instance finds them"),
}

# Read outside the settings classes: name → (where, default, what).
OTHER_VARIABLES: dict[str, tuple[str, str, str]] = {
    "DINREC_KERNEL_CACHE": ("models/kernels.py", "~/.cache/dinrec/kernels",
                            "where the fused C++ kernels are built and cached (keyed on source, torch and CPU)"),
    "DINREC_CPU_ISA": ("models/kernels.py", "native", "avx2: use no AVX-512 or AMX path (what `dinrec bench "
                       "--isa avx2` sets, with ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS "
                       "and FAISS_SIMD_LEVEL)"),
    "DINREC_KERNELS": ("models/kernels.py", "on", "off: load none of dinrec's fused C++ units (scoring, lists, "
                       "Dice); every path runs PyTorch's ops, as on a host with no compiler"),
    "DINREC_SPOT_SHUTDOWN_CMD": ("the spot job's shell script", "shutdown -h now",
                                 "run on the instance when training ends other than by an interruption"),
    "DINREC_SPOT_JOB_KEY": ("the spot job's shell script", "set by the supervisor",
                            "the job's own key, with which the agent signs the results (spot.signing)"),
    "DINREC_CHECKPOINT_KEY": ("training/cli.py", "unset", "sign every checkpoint file and resume only from ones "
                              "signed with it (a spot job's agent sets it to the job's key)"),
    "DINREC_PROMTOOL": ("tests", "promtool on PATH", "promtool for the alert rules' tests (deploy/local/services.sh "
                        "unpacks one from Debian's prometheus package)"),
    "DINREC_HELM": ("tests", "helm on PATH", "helm for the chart's tests (deploy/local/services.sh builds one from "
                    "the Go module proxy)"),
    "DINREC_PROMETHEUS_CRDS": ("tests", "from deploy/local/services.sh", "prometheus-operator's CRD folder "
                               "(example/prometheus-operator-crd): the schemas the chart's ServiceMonitor and "
                               "PrometheusRule are checked against"),
    "DINREC_SHARED_DATA": ("tests, benches", "../shared/data", "the shared datasets"),
    "DINREC_WRITE_API_EXAMPLES": ("tests/serving/test_api_examples.py", "unset", "1: rewrite docs/api.md's answers "
                                  "from a run instead of checking them"),
    "DINREC_GBSTATS_PYTHON": ("tests/experiments/test_gbstats_parity.py", "<venv>-gbstats/bin/python (make test)",
                              "the interpreter of the A/B statistics' reference environment (gbstats)"),
    "DINREC_PEERS_PYTHON": ("benchmarks/peers", "<venv>-peers/bin/python (make peers)",
                            "the interpreter of the library peers' environment (RecTools) `dinrec bench e2e` runs"),
    "DINREC_REQUIRE_SERVICES": ("tests", "unset", "1: a test whose service (Redis, Kafka, AEMM) is missing fails "
                                                  "instead of skipping"),
    "DINREC_AEMM": ("tests, deploy/local/services.sh", "built by services.sh",
                    "the amazon-ec2-metadata-mock binary"),
    "DINREC_SERVICES_DIR": ("deploy/local/services.sh", "~/.cache/dinrec/services",
                            "where the local services are installed"),
    "DINREC_IMAGES_DIR": ("deploy/local/images.sh", "~/.cache/dinrec/images",
                          "the compose stack's image cache: the Debian base's key, the wheelhouse, containers.conf"),
    "DINREC_IMAGE": ("deploy/docker/compose.local.yml, tests/test_stack.py", "printed by deploy/local/images.sh",
                     "dinrec's image the local compose stack runs"),
    "DINREC_REDIS_IMAGE": ("deploy/docker/compose.local.yml", "printed by deploy/local/images.sh",
                           "the local compose stack's Redis image"),
    "DINREC_KAFKA_IMAGE": ("deploy/docker/compose.local.yml", "printed by deploy/local/images.sh",
                           "the local compose stack's Kafka image"),
    "DINREC_API_PORT": ("deploy/docker/docker-compose.yml", "8000", "the loopback port compose publishes the API on"),
    "DINREC_SERVICES_RUN": ("deploy/local/services.sh", "$DINREC_SERVICES_DIR/run", "their data and logs"),
    "DINREC_LOCAL_REDIS_PORT": ("deploy/local/services.sh", "16379", "the local Redis port"),
    "DINREC_LOCAL_REDIS_CLUSTER_PORT": ("deploy/local/services.sh", "17000",
                                        "the first of the local Redis Cluster's six node ports"),
    "DINREC_REDIS_CLUSTER_URL": ("tests, deploy/local/services.sh, dinrec bench serve", "redis://127.0.0.1:17000",
                                 "a node of the Redis Cluster the tests use (3 primaries + 3 replicas)"),
    "DINREC_LOCAL_KAFKA_PORT": ("deploy/local/services.sh", "19092", "the local Kafka broker port"),
    "DINREC_LOCAL_KAFKA_CONTROLLER_PORT": ("deploy/local/services.sh", "19093", "the local KRaft controller port"),
    "DINREC_CI_VENV": (".ci/run", "~/.cache/dinrec/ci-venv-<hash of the dependencies>",
                       "CI's virtual environment, outside the clone"),
}


# Variables that became one shared variable (storage.settings): the warning names the new one.
RENAMED: dict[str, str] = {
    "DINREC_RETRAIN_REGISTRY": "DINREC_REGISTRY", "DINREC_RETRAIN_REGISTRY_CACHE": "DINREC_REGISTRY_CACHE",
    "DINREC_RETRAIN_EXPERIMENTS_FILE": "DINREC_EXPERIMENTS_FILE", "DINREC_RETRAIN_TOPIC": "DINREC_TOPIC",
}


def variable(settings: type[BaseSettings], field: str) -> str:
    alias = settings.model_fields[field].validation_alias  # a shared fact: one variable, whatever the prefix
    if isinstance(alias, str):
        return alias.upper()
    return (settings.model_config.get("env_prefix", "") + field).upper()


def own_fields(settings: type[BaseSettings]) -> list[str]:
    """The fields ``settings`` adds (those it inherits from another listed class are listed once, there)."""
    inherited = {f for _, other, _ in COMPONENTS if other is not settings and issubclass(settings, other)
                 for f in other.model_fields}
    return [f for f in settings.model_fields if f not in inherited]


def known_variables() -> set[str]:
    names = {variable(cls, f) for _, cls, _ in COMPONENTS for f in cls.model_fields}
    return names | set(OTHER_VARIABLES)


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """[(name, the closest known name or None)] for each ``DINREC_*`` variable nothing reads."""
    known = sorted(known_variables())
    return [(name, RENAMED.get(name) or next(iter(difflib.get_close_matches(name, known, n=1, cutoff=0.75)), None))
            for name in sorted(environ) if name.startswith(PREFIX) and name not in known]


def unknown_warnings(environ: Mapping[str, str]) -> list[str]:
    return [f"warning: {name} is not a dinrec setting" + (f" (did you mean {close}?)" if close else "")
            for name, close in unknown_variables(environ)]


def _type(annotation) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(str(a) for a in typing.get_args(annotation))
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return " \\| ".join(str(m.value) for m in annotation)
        return {SecretStr: "secret", Path: "path"}.get(annotation, annotation.__name__)
    text = str(annotation).replace("typing.", "").replace("pathlib.", "").replace("pydantic.types.", "")
    return text.replace("NoneType", "None").replace("SecretStr", "secret").replace("|", "\\|").replace("Path", "path")


def _default(field) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "—"
    if isinstance(value, (set, frozenset, list, tuple)) and not value:
        return "[]"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def reference() -> str:
    """The configuration reference in Markdown: what ``dinrec config`` prints."""
    lines = ["# Configuration", "",
             "Generated by `dinrec config` from the settings classes (`docs/configuration.md` is tested to equal",
             "it). Every setting is an environment variable; the commands also take some as options. Settings",
             "are validated when a component starts: a value out of range or of the wrong type is an error, a",
             "mistyped keyword raises, and a `DINREC_*` variable that nothing reads is reported by every command",
             "with the closest known name.", "",
             "## What a deployment must set", "",
             "The defaults run the whole loop on a laptop (`dinrec demo`). A deployment sets these; the rest may stay",
             "as they are ([deploying](deploying.md), [facing clients](serving.md#facing-clients)).", "",
             "| variable | for example | why |", "|---|---|---|"]
    lines += [f"| `{name}` | `{example}` | {_cell(why)} |" for name, (example, why) in MUST_SET.items()]
    lines.append("")
    for title, cls, commands in COMPONENTS:
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        lines += [f"## {title}", "", f"`{cls.__module__}.{cls.__name__}`; read by `dinrec {commands}`."
                  + (f" {_cell(doc)}" if doc and not doc.startswith("Usage docs") else ""), "",
                  "| variable | type | default | description |", "|---|---|---|---|"]
        for name in own_fields(cls):
            field = cls.model_fields[name]
            lines.append(f"| `{variable(cls, name)}` | {_type(field.annotation)} | {_cell(_default(field))} | "
                         f"{_cell(field.description or '')} |")
        lines.append("")
    lines += ["## Read outside the settings classes", "", "| variable | read by | default | description |",
              "|---|---|---|---|"]
    lines += [f"| `{name}` | {where} | {_cell(default)} | {_cell(what)} |"
              for name, (where, default, what) in sorted(OTHER_VARIABLES.items())]
    return "\n".join(lines) + "\n"
