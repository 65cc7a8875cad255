"""Damaged repro bundles and hostile output paths (issue 26): the report reads each bundle through
attncheck_report.bundles (a child process, every h5py error caught, crashes and hangs contained)
and shows an unreadable bundle as such; report.html and summary.md are never written through a
symbolic link or into a FIFO.

The fuzz test mutates a real-shaped bundle with a fixed seed (byte flips, zeroed ranges,
truncation) and adds the libhdf5 crash/loop inputs of fuzz/regressions; every one must come back
as contents or as "unreadable", through the path the report uses (render._bundle_contents)."""

import os
import random
import stat
import threading

import pytest

import synthetic
from conftest import REPO, run_report

h5py = pytest.importorskip("h5py")
np = pytest.importorskip("numpy")

from attncheck_report import bundles  # noqa: E402
from attncheck_report.bundles import BundleReader  # noqa: E402
from attncheck_report.render import _bundle_contents  # noqa: E402

REGRESSIONS = REPO / "fuzz" / "regressions" / "golden_h5"
FUZZ_INPUTS = int(os.environ.get("ATTNCHECK_BUNDLE_FUZZ_INPUTS", "300"))


def write_bundle(path):
    """A bundle shaped like write_repro_bundle's (run/results.h): attributes, inputs/expected/
    actual groups, raw-bit and float datasets, variable-length string attributes."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f.attrs["id"] = "mla_decode/h8-bs16-q8-bf16-ctx1023-s0"
        f.attrs["op"] = "mla_decode"
        f.attrs["params"] = '{"heads": 8, "block_size": 16}'
        f.attrs["verdict"] = "failed"
        f.attrs["checks"] = '[{"name": "out", "passed": false}]'
        for group in ("inputs", "expected", "actual"):
            g = f.create_group(group)
            for name, shape in (("q", (4, 8, 64)), ("kv", (16, 64)), ("lse", (4, 8))):
                d = g.create_dataset(name, data=rng.integers(0, 65535, shape, dtype=np.uint16),
                                     chunks=True if name == "q" else None,
                                     compression="gzip" if name == "q" else None)
                d.attrs["dtype"] = "bf16"
                d.attrs["encoding"] = "raw_bits"
    return path


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    how = rng.randrange(3)
    if how == 0:  # flip a few bytes, mostly in the metadata at the front
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(min(len(b), 4096) if rng.random() < 0.7 else len(b))
            b[at] ^= 1 << rng.randrange(8)
    elif how == 1:  # zero a range
        at = rng.randrange(len(b))
        b[at:at + rng.randint(1, 64)] = bytes(min(len(b) - at, rng.randint(1, 64)))
    else:  # truncate
        del b[rng.randrange(len(b)):]
    return bytes(b)


def in_process_error(path):
    """What reading the bundle in-process (as the report did) raises, or None."""
    try:
        with h5py.File(path, "r") as f:
            f.visititems(lambda n, o: list(o.shape) if isinstance(o, h5py.Dataset) else None)
    except Exception as e:  # noqa: BLE001
        return e
    return None


def test_damaged_bundles_never_end_the_report(tmp_path):
    good = write_bundle(tmp_path / "good.h5")
    data = good.read_bytes()
    rng = random.Random(26)
    paths = []
    for i in range(FUZZ_INPUTS):
        p = tmp_path / f"m{i:04d}.h5"
        p.write_bytes(mutate(data, rng))
        paths.append(p)
    regressions = sorted(REGRESSIONS.glob("*.h5"))
    assert len(regressions) >= 3
    paths += regressions
    unreadable = 0
    with BundleReader(timeout_s=5) as reader:
        assert _bundle_contents(reader, good).startswith("actual/kv[16, 64], actual/lse[4, 8]")
        for p in paths:
            text = _bundle_contents(reader, p)  # must not raise, hang or end this process
            assert isinstance(text, str)
            unreadable += text.startswith("(unreadable bundle: ")
    assert unreadable > 0
    print(f"{len(paths)} damaged bundles, {unreadable} shown as unreadable")


def test_hang_and_crash_are_contained_with_a_reason(tmp_path):
    fifo = tmp_path / "hangs.h5"
    os.mkfifo(fifo)  # opening it blocks forever, as a libhdf5 loop would
    with BundleReader(timeout_s=2) as reader:
        assert "timed out after 2 s" in reader.describe(fifo)["unreadable"]
        # A reader that dies mid-read (libhdf5 SIGSEGV) is reported and replaced.
        killer = threading.Timer(1.0, lambda: os.kill(reader.child.pid, 11))
        killer.start()
        crash = reader.describe(fifo)
        killer.join()
        assert "the reading process ended (signal 11" in crash["unreadable"], crash
        assert "contents" in reader.describe(write_bundle(tmp_path / "b.h5"))
    # The timeout can be set for slow machines; a bad value is refused.
    assert bundles.bundle_timeout_s({"ATTNCHECK_BUNDLE_READ_TIMEOUT": "7.5"}) == 7.5
    with pytest.raises(ValueError, match="ATTNCHECK_BUNDLE_READ_TIMEOUT"):
        bundles.bundle_timeout_s({"ATTNCHECK_BUNDLE_READ_TIMEOUT": "nan"})


def failing_run_with_bundle(directory, bundle_bytes):
    records = [synthetic.record("mla_decode", "h8-bs16-q8-bf16-ctx1023-s0", {"heads": 8},
                                "failed", [synthetic.numeric_check("out", 3.0)], "out: 3x budget")]
    d = synthetic.write_results(directory, records)
    (d / "repro").mkdir()
    (d / "repro" / "mla_decode__h8-bs16-q8-bf16-ctx1023-s0.h5").write_bytes(bundle_bytes)
    return d


# Regression: 211 of 619 fuzzed bundles ended `attncheck report` with an uncaught h5py
# RuntimeError/KeyError, exit 1 and no report.
def test_report_shows_a_bundle_h5py_chokes_on_as_unreadable(tmp_path):
    data = write_bundle(tmp_path / "good.h5").read_bytes()
    rng = random.Random(26)
    chosen = None
    for i in range(2000):
        p = tmp_path / "candidate.h5"
        p.write_bytes(mutate(data, rng))
        err = in_process_error(p)
        if err is not None and not isinstance(err, OSError):  # what the report did not catch
            chosen = p.read_bytes()
            break
    assert chosen is not None, "no mutation made h5py raise a non-OSError"
    d = failing_run_with_bundle(tmp_path / "run", chosen)
    proc = run_report(d, "--out", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    html = (tmp_path / "o" / "report.html").read_text()
    assert "(unreadable bundle: " in html


def test_report_never_writes_through_links_or_into_fifos(tmp_path):
    d = failing_run_with_bundle(tmp_path / "run", write_bundle(tmp_path / "b.h5").read_bytes())
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for name in ("report.html", "summary.md"):
        out = tmp_path / f"out_link_{name}"
        out.mkdir()
        (out / name).symlink_to(victim)
        proc = run_report(d, "--out", out)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"refusing to replace '{out / name}': it is a symbolic link" in proc.stderr
        assert (out / name).is_symlink()
    assert victim.read_text() == "precious\n"

    out = tmp_path / "out_fifo"
    out.mkdir()
    os.mkfifo(out / "summary.md")
    proc = run_report(d, "--out", out)  # run_report's timeout: a blocked open would hang here
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "it is a FIFO" in proc.stderr
    assert stat.S_ISFIFO(os.lstat(out / "summary.md").st_mode)

    out = tmp_path / "out_ok"
    proc = run_report(d, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "summary.md"]


def test_merge_never_writes_through_links(tmp_path):
    from attncheck_report.merge import main as merge_main
    d = failing_run_with_bundle(tmp_path / "run", b"not hdf5")
    (d / "junit.xml").write_text("<testsuites/>")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "merged"
    out.mkdir()
    (out / "run.json").symlink_to(victim)
    assert merge_main([str(d), "--out", str(out)]) == 2
    assert victim.read_text() == "precious\n"
    out = tmp_path / "merged_ok"
    assert merge_main([str(d), "--out", str(out)]) == 0
    assert (out / "repro" / "mla_decode__h8-bs16-q8-bf16-ctx1023-s0.h5").read_bytes() == b"not hdf5"
