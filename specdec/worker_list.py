"""The workers file: the list of worker addresses a router re-reads while it runs (router.discovery).

Something else keeps it current: the Ray deployment (specdec.deploy) rewrites it from its actors, or an
operator edits it. Its format, `{targets: [host:port, ...], drafts: [...]}`, lives here because both
the router and the deployment use it and the services import nothing from each other.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdec.errors import InvalidArgument


@dataclass(frozen=True)
class WorkerSet:
    targets: tuple[str, ...] = ()  # host:port, in the order found
    drafts: tuple[str, ...] = ()


def read_workers_file(path: str | Path) -> WorkerSet:
    """The file's lists; a missing file lists nobody; a malformed one raises InvalidArgument."""
    import yaml

    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return WorkerSet()
    except OSError as exc:
        raise InvalidArgument(f"cannot read workers file {str(path)!r}: {exc}") from exc
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise InvalidArgument(f"workers file {str(path)!r} is not YAML: {exc}") from exc
    if not isinstance(data, dict) or set(data) - {"targets", "drafts"}:
        raise InvalidArgument(f"workers file {str(path)!r} must be a mapping with keys targets and drafts")
    lists = []
    for key in ("targets", "drafts"):
        items = data.get(key) or []
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise InvalidArgument(f"workers file {str(path)!r}: {key} must be a list of HOST:PORT strings")
        lists.append(tuple(items))
    return WorkerSet(*lists)


def write_workers_file(path: str | Path, workers: WorkerSet) -> None:
    """Replace the file in one step (write aside, rename), so a reader never sees half of it."""
    import yaml

    path = Path(path)
    aside = path.with_name(path.name + ".tmp")
    aside.write_text(yaml.safe_dump({"targets": list(workers.targets), "drafts": list(workers.drafts)}))
    aside.replace(path)
