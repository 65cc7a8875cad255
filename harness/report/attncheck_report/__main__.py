"""Entry point. Finds an interpreter with the report's packages before doing anything else.

The first `python3` on PATH may be a pyenv/venv interpreter without Debian's python3-numpy,
python3-matplotlib and python3-jinja2; /usr/bin/python3 has them. Rather than fail, re-run under
the first candidate that has them, and say clearly what is missing when none has.
"""

import importlib
import os
import subprocess
import sys

NEEDED = {"numpy": "python3-numpy", "matplotlib": "python3-matplotlib", "jinja2": "python3-jinja2"}
CANDIDATES = ("/usr/bin/python3",)
GUARD = "ATTNCHECK_REPORT_REEXEC"


def missing_here():
    missing = []
    for module in NEEDED:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    return missing


def has_modules(python):
    probe = "import " + ", ".join(NEEDED)
    try:
        probe_run = subprocess.run([python, "-c", probe], capture_output=True, timeout=120)
        return probe_run.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def main():
    missing = missing_here()
    if missing:
        tried = []
        if not os.environ.get(GUARD):
            # The same binary is a candidate too: started with -S or -I, or as a venv's python,
            # it lacks the site packages that a plain /usr/bin/python3 has. GUARD stops loops.
            for python in CANDIDATES:
                if not os.access(python, os.X_OK):
                    continue
                tried.append(python)
                if has_modules(python):
                    env = dict(os.environ, **{GUARD: "1"})
                    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
                    env["PYTHONPATH"] = os.pathsep.join(
                        p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
                    os.execve(python, [python, "-m", "attncheck_report"] + sys.argv[1:], env)
        packages = " ".join(NEEDED[m] for m in missing)
        print(
            f"attncheck_report: {sys.executable} lacks {', '.join(missing)}"
            + (f"; so does {', '.join(tried)}" if tried else "")
            + f".\n  Debian/Ubuntu: apt-get install {packages} (then run /usr/bin/python3 -m"
            " attncheck_report), or install them for this interpreter.",
            file=sys.stderr,
        )
        return 3
    from attncheck_report.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
