"""A config of the user's own that bsexp's own of the same name would hide. Hydra searches
`hydra.searchpath`'s folders after bsexp's conf/ and takes the first match, so my_conf/model/cnn.yaml
beside bsexp's conf/model/cnn.yaml is never read: the run would train bsexp's cnn as if it were the
user's. Refused before anything runs (one line, exit 2), naming both files and what to do."""

from __future__ import annotations

from pathlib import Path

from bsexp.errors import ConfigError

SHIPPED = Path(__file__).resolve().parents[1] / "conf"


def check_not_shadowed(args: list[str], shipped: Path = SHIPPED) -> None:
    """Each `group=choice` of the command line (a sweep's choices too) that both bsexp's conf/ and
    a file:// folder of `hydra.searchpath` hold: ConfigError."""
    folders = [Path(p) for a in args if a.startswith("hydra.searchpath=") for p in _file_entries(a)]
    if not folders:
        return
    for arg in args:
        key, eq, value = arg.partition("=")
        group = key.lstrip("+~").partition("@")[0]
        if not eq or not group or "." in group or group.startswith("hydra") or not (shipped / group).is_dir():
            continue
        for choice in (c.strip() for c in value.split(",")):
            ours, mine = shipped / group / f"{choice}.yaml", (f / group / f"{choice}.yaml" for f in folders)
            theirs = next((path for path in mine if path.is_file()), None)
            if choice and ours.is_file() and theirs is not None:
                raise ConfigError(
                    key,
                    value,
                    f"{theirs} is hidden by bsexp's own {group}/{choice}.yaml (Hydra reads bsexp's conf/ before "
                    f"hydra.searchpath's folders): rename yours, e.g. {group}/my_{choice}.yaml and {key}=my_{choice}",
                )


def _file_entries(arg: str) -> list[str]:
    """The filesystem folders of `hydra.searchpath=[file://a,file://b]` (pkg:// entries left out)."""
    inside = arg.partition("=")[2].strip().strip("[]")
    entries = (e.strip().strip("'\"") for e in inside.split(","))
    return [e.removeprefix("file://") for e in entries if e.startswith("file://")]
