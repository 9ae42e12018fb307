"""Byte sizes (segue.units): GB is 10^9 bytes and GiB 2^30, read and written one way by the
CLI, the API and flows (issue 35 §3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from segue.errors import FlowError, UsageError
from segue.flow.model import parse_memory
from segue.inference import gpus
from segue.units import MAX_BYTES, SizeError, format_bytes, in_unit, parse_bytes


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("80GB", 80_000_000_000),
        ("80 gb", 80_000_000_000),
        ("80G", 80_000_000_000),
        ("80GiB", 80 * 2**30),
        ("80Gi", 80 * 2**30),
        ("512MiB", 512 * 2**20),
        ("512MB", 512_000_000),
        ("1.5GB", 1_500_000_000),
        ("1.5KiB", 1536),
        ("2kB", 2000),
        ("1TB", 10**12),
        ("1TiB", 2**40),
        ("4096", 4096),
        (" 7 B ", 7),
        (4096, 4096),
        (0, 0),
    ],
)
def test_decimal_and_binary_units_are_never_mixed(text: str | int, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize(
    "bad", ["80 gigs", "GB", "-1GB", "1e9", "", True, 1.5, -1, MAX_BYTES + 1, "10000PB"]
)
def test_a_bad_size_is_one_line_naming_the_units(bad: object) -> None:
    with pytest.raises(
        SizeError,
        match=r"^--gpu-mem must be a size such as 80GB \(10\^9 bytes\), "
        r"80GiB \(2\^30 bytes\), 512MiB or a number of bytes"
        r"( from 0 to 8 EiB)?, not .+; units: B, kB, MB, GB, TB "
        r"\(10\^3\.\.10\^12\), KiB, MiB, GiB, TiB \(2\^10\.\.2\^40\)$",
    ):
        parse_bytes(bad, "--gpu-mem")  # type: ignore[arg-type]
    with pytest.raises(UsageError):  # a layer passes its own class: the CLI exits 2
        parse_bytes("x", "--gpu-mem", error=UsageError)


def test_sizes_print_in_the_unit_they_were_computed_in() -> None:
    assert in_unit(80_000_000_000, "GB") == "80.00 GB"  # not 85.90 GB, not 74.51 "GB"
    assert in_unit(80_000_000_000, "GiB") == "74.51 GiB"
    assert in_unit(80 * 2**30, "GiB", 1) == "80.0 GiB"
    with pytest.raises(ValueError, match=r"^unknown unit 'gb'; use one of B, kB, MB, GB"):
        in_unit(1, "gb")
    assert format_bytes(999) == "999 B" and format_bytes(1_500_000_000) == "1.5 GB"
    assert format_bytes(1536, binary=True) == "1.5 KiB" and format_bytes(10**18) == "1000.0 PB"


def test_a_flows_memory_reads_gb_as_the_cli_does() -> None:
    # a step's and a handler's gpu_memory="40GB" asks for what `--gpu-mem 40GB` does
    assert parse_memory("40GB", "gpu_memory") == 40_000_000_000
    assert parse_memory("40GiB", "gpu_memory") == 40 * 2**30
    assert parse_memory(None, "gpu_memory") is None
    with pytest.raises(FlowError, match=r"^step 'x': memory must be a size such as 80GB "):
        parse_memory("lots", "step 'x': memory")


def test_a_given_gpu_memory_is_labelled_in_gb() -> None:
    g = gpus.custom(80_000_000_000, gpus.gpu("h100"))
    assert g.capacity_bytes == 80_000_000_000 and g.label.endswith(", 80.00 GB given")


def test_pool_set_stores_gb_as_10_to_the_9(tmp_path: Path) -> None:
    env = {**os.environ, "SEGUE_HOME": str(tmp_path / "home")}  # SEGUE_POOL: conftest, per test

    def segue(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "segue", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    proc = segue(
        "pool",
        "--json",
        "set",
        "--gpus",
        "1",
        "--gpu-mem",
        "80GB",
        "--group",
        "1x24GiB:l4",
        "--cpus",
        "2",
        "--memory",
        "64GiB",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [d["memory"] for d in doc["devices"]] == [80_000_000_000, 24 * 2**30]
    assert doc["memory"] == 64 * 2**30
    proc = segue("pool", "set", "--gpus", "1", "--gpu-mem", "80 gigs")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("segue: --gpu-mem must be a size such as 80GB (10^9 bytes)")
