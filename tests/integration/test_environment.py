"""The run's environment, recorded at submit and checked at resume (issue 38 §5).

Real `segue` processes against a real home: a flow that declares ``env=[...]``,
a step that imports a throwaway distribution (a dist-info directory on a
PYTHONPATH entry, whose version the test changes between the runs), commits a
checkpoint and fails until a marker file exists; ``--pause-on-failure`` leaves
the run PAUSED with nothing timed. The pure parts (secret patterns, the
nvidia-smi parsers, torch's CUDA runtime read from its files) are checked on
captured strings and throwaway files; a fake ``nvidia-smi`` on the PATH runs
the capture's subprocess path on this machine without a GPU.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from segue_helpers import Segue

from segue.errors import FlowError
from segue.flow import Flow
from segue.run import environment as envmod

FLOW = """\
import os
from segue import Flow

flow = Flow("envflow", params={"marker": ""}, env=["MY_FLAG", "MY_TOKEN", "MY_DSN"])


@flow.step
def work(ctx):
    import segueprobe  # a distribution the step's process imports

    ctx.checkpoint({"value": segueprobe.VALUE}, durable=True)
    if not os.path.exists(ctx.params["marker"]):
        raise RuntimeError("stopped until the marker exists")
    return {"value": segueprobe.VALUE}
"""

SECRET = "tok-5ecr3t-VALUE-never-stored"
DSN_PASSWORD = "dsn-pa55word-never-stored"


def dist(site: Path, name: str, version: str) -> None:
    """A tiny distribution ``name`` (one module of the same name) at ``version`` in ``site``."""
    for old in site.glob(f"{name}-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    (site / f"{name}.py").write_text("VALUE = 1\n")
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{name}\n")
    (info / "RECORD").write_text(f"{name}.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


@pytest.fixture
def envrun(segue: Segue, tmp_path: Path):
    """(segue, start): ``start(run_id)`` submits a run that ends PAUSED after its step
    committed a checkpoint and failed; it resumes to success once the marker exists."""
    site = tmp_path / "site"
    site.mkdir()
    dist(site, "segueprobe", "1.0")  # imported by the step
    dist(site, "segueidle", "1.0")  # installed, never imported
    flow = tmp_path / "envflow.py"
    flow.write_text(FLOW)
    segue.env.update({"PYTHONPATH": str(site), "MY_FLAG": "on", "MY_TOKEN": SECRET,
                      "MY_DSN": f"postgresql://me:{DSN_PASSWORD}@db/x"})
    segue.env.pop("SEGUE_ON_ENV_CHANGE", None)
    marker = tmp_path / "marker"

    def start(run_id: str) -> None:
        proc = segue("run", str(flow), "--run-id", run_id, "-p", f"marker={marker}", "--pause-on-failure")
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert segue.status(run_id)["state"] == "PAUSED"

    return segue, start, site, marker


def snapshot(segue: Segue, run_id: str) -> tuple[object, ...]:
    st = segue.status(run_id)
    return st["state"], json.dumps(st["steps"], sort_keys=True), json.dumps(segue.events(run_id))


def one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_a_changed_declared_variable_is_refused_with_one_line_and_nothing_written(envrun) -> None:
    segue, start, _, _ = envrun
    start("v1")
    before = snapshot(segue, "v1")
    proc = segue("resume", "v1", env={"MY_FLAG": "off"})
    assert proc.returncode == 2, proc.stderr
    line = one_line(proc.stderr)
    assert "MY_FLAG changed" in line and "--on-env-change" in line and "off" not in line.split(":", 1)[1]
    assert snapshot(segue, "v1") == before  # nothing written: no event, no option, no state
    # A secret changed is refused too, and named without its value.
    proc = segue("resume", "v1", env={"MY_TOKEN": "another-secret-value"})
    assert proc.returncode == 2 and "MY_TOKEN changed" in proc.stderr
    assert "another-secret-value" not in proc.stderr
    env = {k: v for k, v in segue.env.items() if k != "MY_FLAG"}  # unset in the resuming process
    unset = subprocess.run([sys.executable, "-m", "segue", "resume", "v1"], capture_output=True, text=True,
                           env=env, timeout=120)
    assert unset.returncode == 2 and "MY_FLAG now unset" in unset.stderr
    assert snapshot(segue, "v1") == before


def test_allow_resumes_and_the_event_says_so(envrun) -> None:
    segue, start, _, marker = envrun
    start("a1")
    marker.touch()
    proc = segue("resume", "a1", "--on-env-change", "allow", env={"MY_FLAG": "off"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning" not in proc.stderr  # allow: the blocking change is recorded, not warned about
    assert segue.status("a1")["state"] == "SUCCEEDED"
    ev = [e for e in segue.events("a1") if e["kind"] == "environment" and e["step"] is None]
    assert [e["data"]["at"] for e in ev] == ["submit", "resume"]
    last = ev[-1]
    assert "MY_FLAG changed" in last["reason"] and "on_env_change=allow" in last["reason"]
    assert last["data"]["policy"] == "allow"
    assert [c["text"] for c in last["data"]["changes"] if c["blocking"]] == ["MY_FLAG changed"]
    # The choice is stored with the run, like --on-input-change.
    opts = [e for e in segue.events("a1") if e["kind"] == "options" and e["data"].get("on_env_change") == "allow"]
    assert opts, "the option change is an event"


def test_warn_resumes_with_a_warning(envrun) -> None:
    segue, start, _, marker = envrun
    start("w1")
    marker.touch()
    proc = segue("resume", "w1", "--on-env-change", "warn", env={"MY_FLAG": "off"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = [x for x in proc.stderr.splitlines() if x.startswith("segue: warning:")]
    assert len(warnings) == 1 and "MY_FLAG changed" in warnings[0], proc.stderr
    assert segue.status("w1")["state"] == "SUCCEEDED"
    # The new environment is the baseline now: `segue env` in it shows no change.
    out = segue("env", "w1", "--json", env={"MY_FLAG": "off"})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["recorded_at"] == "resume" and doc["policy"] == "warn"
    assert not [c for c in doc["changes"] if c["kind"] == "variable"]


def test_a_distribution_the_step_imported_changed_is_refused(envrun) -> None:
    segue, start, site, marker = envrun
    start("d1")
    doc = segue.json("env", "d1")
    assert doc["imported"]["work"] and "segueprobe" in doc["imported"]["work"]
    assert "segueidle" not in doc["imported"]["work"]
    assert doc["recorded"]["distributions"]["segueprobe"] == "1.0"
    assert doc["changes"] == [] and doc["would_refuse"] is False
    dist(site, "segueprobe", "1.1")
    before = snapshot(segue, "d1")
    proc = segue("resume", "d1")
    assert proc.returncode == 2, proc.stderr
    line = one_line(proc.stderr)
    assert "segueprobe 1.0 -> 1.1" in line and "work" in line, line
    assert snapshot(segue, "d1") == before
    doc = segue.json("env", "d1")
    assert doc["would_refuse"] is True
    assert [(c["text"], c["blocking"], c["steps"]) for c in doc["changes"]] == [
        ("segueprobe 1.0 -> 1.1", True, ["work"])]
    text = segue("env", "d1").stdout
    assert "! segueprobe 1.0 -> 1.1" in text and "a resume would be refused" in text
    # --restart-step starts the step over: what it imported before no longer matters.
    marker.touch()
    proc = segue("resume", "d1", "--restart-step", "work")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert segue.status("d1")["state"] == "SUCCEEDED"


def test_a_worker_killed_right_after_its_commit_left_its_imports_on_record(envrun, tmp_path: Path) -> None:
    """The imports are written before each checkpoint commit, not only when the attempt ends:
    a worker SIGKILLed just after its commit never reaches its end."""
    segue, _, site, _ = envrun
    proc = segue("run", str(tmp_path / "envflow.py"), "--run-id", "k1", "-p", f"marker={tmp_path / 'marker'}",
                 "--pause-on-failure", env={"SEGUE_FAULTS": "ctx.after_commit:kill", "SEGUE_FAULTS_IN": "worker"})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    step = segue.step("k1", "work")
    assert step["last_checkpoint"] is not None and "SIGKILL" in json.dumps(segue.events("k1"))
    assert "segueprobe" in segue.json("env", "k1")["imported"]["work"]
    dist(site, "segueprobe", "1.1")
    proc = segue("resume", "k1")
    assert proc.returncode == 2 and "segueprobe 1.0 -> 1.1 (imported by work)" in one_line(proc.stderr)


def test_a_distribution_the_step_did_not_import_is_only_a_warning(envrun) -> None:
    segue, start, site, marker = envrun
    start("u1")
    dist(site, "segueidle", "1.1")
    marker.touch()
    proc = segue("resume", "u1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = [x for x in proc.stderr.splitlines() if x.startswith("segue: warning:")]
    assert len(warnings) == 1 and "segueidle 1.0 -> 1.1" in warnings[0], proc.stderr
    assert segue.status("u1")["state"] == "SUCCEEDED"


def test_secret_values_are_stored_only_as_digests(envrun) -> None:
    segue, start, _, _ = envrun
    start("s1")
    out = segue("env", "s1", "--json")
    assert out.returncode == 0, out.stderr
    assert SECRET not in out.stdout and DSN_PASSWORD not in out.stdout
    doc = json.loads(out.stdout)
    variables = doc["recorded"]["variables"]
    assert variables["MY_FLAG"]["value"] == "on"
    for name in ("MY_TOKEN", "MY_DSN"):  # a secret's name, a password inside a URL
        assert variables[name]["secret"] is True and "value" not in variables[name]
        assert variables[name]["digest"].startswith("pbkdf2-sha256:100000:")  # slow to guess
    assert "salt" not in doc["recorded"]
    # Nowhere in the home: the store (its WAL too), the logs, the checkpoints.
    for path in segue.home.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert SECRET.encode() not in data and DSN_PASSWORD.encode() not in data, path
    assert SECRET not in segue("env", "s1").stdout and SECRET not in segue("events", "s1", "--json").stdout


def test_the_recorded_environment_and_a_run_without_one(envrun) -> None:
    segue, start, _, _ = envrun
    start("r1")
    doc = segue.json("env", "r1")
    rec = doc["recorded"]
    assert rec["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert rec["distributions"]["segueprobe"] == "1.0" and rec["distributions"]["segueidle"] == "1.0"
    assert rec["flow"]["digest"].startswith("sha256:") and rec["flow"]["path"].endswith("envflow.py")
    assert doc["recorded_at"] == "submit" and doc["policy"] == "fail"
    text = segue("env", "r1").stdout
    assert "$MY_FLAG 'on'" in text and "step work imported" in text and "segueprobe 1.0" in text
    nope = segue("env", "nope")
    assert nope.returncode == 2 and "unknown run 'nope'" in one_line(nope.stderr)
    # --on-env-change at run is stored with the run.
    proc = segue("run", str(Path(rec["flow"]["path"])), "--run-id", "r2", "-p", "marker=/nonexistent",
                 "--pause-on-failure", "--on-env-change", "warn")
    assert proc.returncode == 3
    assert segue.json("env", "r2")["policy"] == "warn"


def test_the_api_and_the_run_page_show_the_environment(envrun, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from segue.home import Home
    from segue.server.app import create_app

    segue, start, site, _ = envrun
    start("p1")
    dist(site, "segueprobe", "1.1")
    # The server's environment is this test process's: give it the same site directory.
    sys.path.insert(0, str(site))
    try:
        import importlib

        importlib.invalidate_caches()
        app = create_app(Home.resolve(segue.home), auth=False)
        with TestClient(app) as c:
            doc = c.get("/api/runs/p1/environment").json()
            assert doc["recorded"]["distributions"]["segueprobe"] == "1.0"
            assert any(ch["text"] == "segueprobe 1.0 -> 1.1" and ch["blocking"] for ch in doc["changes"])
            page = c.get("/runs/p1").text
            assert 'id="environment"' in page and "segueprobe 1.0 -&gt; 1.1" in page
            assert "a resume would be refused" in page
            assert SECRET not in page
            refused = c.post("/api/runs/p1/resume", json={})
            assert refused.status_code == 400, refused.text
            assert "segueprobe 1.0 -> 1.1" in refused.json()["error"]
            assert '"on_env_change" warn' in refused.json()["error"]  # the API's words for the flag
            assert segue.status("p1")["state"] == "PAUSED"
    finally:
        sys.path.remove(str(site))


# -- the pure parts -------------------------------------------------------------------------

SMI_QUERY = "NVIDIA H100 80GB HBM3, 550.54.15\nNVIDIA H100 80GB HBM3, 550.54.15\n"
SMI_HEADER = """\
Sun Dec  6 21:00:00 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |
+-----------------------------------------+------------------------+----------------------+
"""


def test_nvidia_smi_output_is_parsed() -> None:
    assert envmod.parse_smi_query(SMI_QUERY) == ("550.54.15", ["NVIDIA H100 80GB HBM3"] * 2)
    assert envmod.parse_smi_query("") == (None, [])
    assert envmod.parse_smi_header(SMI_HEADER) == "12.4"
    assert envmod.parse_smi_header("NVIDIA-SMI has failed because it couldn't communicate") is None


def test_cuda_through_a_fake_nvidia_smi_and_without_one(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    (tmp_path / "query.txt").write_text(SMI_QUERY)
    (tmp_path / "header.txt").write_text(SMI_HEADER)
    smi.write_text(f'#!/bin/sh\ncase "$1" in --query-gpu=*) cat {tmp_path}/query.txt;; '
                   f'*) cat {tmp_path}/header.txt;; esac\n')
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    got = envmod.capture_cuda({"nvidia-cuda-runtime-cu12": "12.4.127"}, smi=str(smi))
    assert got is not None
    assert (got["driver"], got["driver_cuda"], got["gpus"]) == ("550.54.15", "12.4", ["NVIDIA H100 80GB HBM3"] * 2)
    assert got["runtime"]["nvidia-cuda-runtime-cu12"] == "12.4.127"
    # A failing or hanging nvidia-smi never fails the capture.
    bad = tmp_path / "bad-smi"
    bad.write_text("#!/bin/sh\nexit 9\n")
    bad.chmod(bad.stat().st_mode | stat.S_IXUSR)
    assert envmod.capture_cuda({}, smi=str(bad)) == envmod.capture_cuda({}, smi="")
    assert envmod.capture_cuda({}, smi=str(tmp_path / "missing")) == envmod.capture_cuda({}, smi="")
    # This machine has no driver: nvidia-smi is not on the PATH, so there is no driver record.
    env = {**os.environ, "PATH": str(tmp_path / "empty")}
    out = subprocess.run([sys.executable, "-c", "import json; from segue.run.environment import capture_cuda; "
                          "print(json.dumps(capture_cuda({})))"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got is None or set(got) == {"runtime"}


def test_torchs_cuda_runtime_is_read_without_importing_torch(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.4.0+cu121'\ncuda: Optional[str] = '12.1'\n")
    info = site / "torch-2.4.0+cu121.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.4.0+cu121\n")
    code = ("import sys; from segue.run.environment import torch_cuda_runtime; "
            "print(torch_cuda_runtime(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(site)})
    assert out.stdout.split() == ["12.1", "False"], out.stderr


def test_secret_patterns_and_entries() -> None:
    for name in ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "PGPASSWORD", "MY_PASSWORD",
                 "DATABASE_DSN", "GITHUB_TOKENS", "api_key"):
        assert envmod.is_secret(name), name
    for name in ("HF_HOME", "MY_FLAG", "CUDA_VISIBLE_DEVICES", "KEYBOARD", "MONKEY_COUNT", "TOKENIZERS_PARALLELISM"):
        assert not envmod.is_secret(name), name
    assert envmod.is_secret("DATABASE_URL", "postgresql://u:pw@h/db")
    assert not envmod.is_secret("DATABASE_URL", "postgresql://u@h/db")
    salt = "00" * 16
    assert envmod.variable_entry(salt, "X", None) == {"set": False}
    e = envmod.variable_entry(salt, "HF_TOKEN", "hf_abc")
    assert e["secret"] and "value" not in e and "hf_abc" not in json.dumps(e)
    assert envmod.variable_entry(salt, "X", "1")["value"] == "1"
    assert "value" not in envmod.variable_entry(salt, "X", "x" * 5000)  # long: its digest only
    assert envmod.variable_entry(salt, "X", "1")["digest"].startswith("hmac-sha256:")
    lines = envmod.describe({"distributions": {"numpy": "2.1.0"}},
                            {f"score.{i}": ["numpy"] for i in range(10_000)} | {"join": []})
    assert [x for x in lines if "imported" in x] == [
        "steps score.0, score.1, score.2 and 9997 more imported 1 distributions: numpy 2.1.0",
        "step join imported 0 distributions: none"]


def test_diff_orders_blocking_first_and_names_what_changed() -> None:
    salt = "11" * 16
    rec = {"salt": salt, "distributions": {"numpy": "2.1.0", "rich": "13.0", "gone": "1.0"},
           "variables": {"MY_FLAG": envmod.variable_entry(salt, "MY_FLAG", "1")},
           "python": {"implementation": "cpython", "version": "3.11.7"}, "cuda": None,
           "flow": {"digest": "sha256:a"}}
    now = {"distributions": {"numpy": "2.2.1", "rich": "14.0", "new": "0.1"}, "variables": {"MY_FLAG": {}},
           "python": {"implementation": "cpython", "version": "3.11.9"}, "cuda": {"driver": "550.54.15"},
           "flow": {"digest": "sha256:b"}}
    changes = envmod.diff(rec, now, environ={"MY_FLAG": "2"}, imported={"train": {"numpy"}},
                          module_dists=lambda: {"numpy": ["numpy"], "rich": ["rich"]})
    texts = [(c.text, c.blocking) for c in changes]
    assert texts[:2] == [("MY_FLAG changed", True), ("numpy 2.1.0 -> 2.2.1", True)]
    assert ("rich 13.0 -> 14.0", False) in texts and ("gone 1.0 removed", False) in texts
    assert ("new 0.1 added", False) in texts and ("python version 3.11.7 -> 3.11.9", False) in texts
    assert ("cuda driver none -> 550.54.15", False) in texts and ("the flow file changed", False) in texts
    same = envmod.diff(rec, now, environ={"MY_FLAG": "1"}, imported={"train": {"numpy"}}, module_dists=dict)
    assert not [c for c in same if c.kind == "variable" or c.blocking]  # unmapped modules block nothing


@pytest.mark.parametrize("env", ["HF_HOME", ["1BAD"], ["A", "A"], [3]])
def test_bad_env_declarations_are_refused(env: object) -> None:
    with pytest.raises(FlowError, match="env must be a list of distinct variable names"):
        Flow("f", env=env)  # type: ignore[arg-type]
    assert Flow("f", env=["HF_HOME", "MY_FLAG"]).env == ("HF_HOME", "MY_FLAG")
