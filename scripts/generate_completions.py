"""Write completions/torchkit.{bash,zsh,fish} from the app with Typer's own completion machinery.

    uv run python scripts/generate_completions.py          # (re)write the files
    uv run python scripts/generate_completions.py --check  # exit 1 if a committed file is stale

The scripts are what `torchkit --show-completion` prints (torchkit.cli.completion): thin shell glue
that calls torchkit back with `_TORCHKIT_COMPLETE=complete_<shell>`, so commands and options added
later complete without regenerating; only a change of program name or of the templates (Typer's,
and what cli/completion.py adds to them) makes them stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from typer.main import get_command

ROOT = Path(__file__).resolve().parent.parent
COMPLETIONS = ROOT / "completions"
SHELLS = ("bash", "zsh", "fish")


def program_name() -> str:
    """The name the app is installed under (`[project.scripts]` and `Typer(name=...)`)."""
    from torchkit.cli import app

    name = get_command(app).name
    if not name:
        raise SystemExit("the torchkit app has no name")
    return name


def completion_scripts() -> dict[str, str]:
    """File name -> contents, for every supported shell."""
    from torchkit.cli.completion import PROGRAM, completion_script

    prog = program_name()
    if prog != PROGRAM:
        raise SystemExit(f"the app is named {prog}, its completion scripts {PROGRAM}")
    return {f"{prog}.{shell}": completion_script(shell) + "\n" for shell in SHELLS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    stale = []
    for name, text in completion_scripts().items():
        path = COMPLETIONS / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    if args.check and stale:
        print("stale: " + ", ".join(stale) + " (run scripts/generate_completions.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
