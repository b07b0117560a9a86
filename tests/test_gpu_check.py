"""benchmarks/gpu_check.sh and the scripts it runs, without a GPU: the
scripts parse; the default run's timeouts, setup included, fit the device
machine's 600 s, and so does each part behind PARTS; no step escapes that
count; the wheels it installs are the pinned ones and are kept out of
git; the engine benchmark and the box check run on nvImageCodec's CPU
backend; the preflight, dmon and summary read what they are given."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
CHECK = BENCH / "gpu_check.sh"
FETCH = BENCH / "fetch_gpu_wheels.sh"
# The device machine's limit on one command, seconds.
COMMAND_LIMIT_S = 600
DEFAULT_PARTS = ["preflight", "engine", "pixels", "stage", "resnet18"]
SETUP = ["gpu-name", "machine", "build", "wheels", "cu13-lib", "versions", "files"]
# Steps of the parts behind PARTS.
OTHER_PARTS = {
    "tests": ["cuda-tests", "torch-startup", "pin-register"],
    "first-batch": ["first-batch"],
    "train-all": ["train-all"],
    "model": ["model"],
}

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
sys.path.insert(0, str(BENCH))


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PARTS"}
    return dict(env, PYTHONPATH=str(ROOT), **extra)


def _plan(parts: str | None = None) -> list[tuple[str, int]]:
    """(step, seconds) of the dry run's plan."""
    env = _env(GPU_CHECK_DRY="1")
    if parts is not None:
        env["PARTS"] = parts
    done = subprocess.run(
        ["bash", str(CHECK)], capture_output=True, text=True, env=env, check=True
    )
    return [
        (m.group(1), int(m.group(2)))
        for m in re.finditer(r"^step (\S+)\s+(\d+) s", done.stdout, re.M)
    ]


@needs_bash
@pytest.mark.parametrize("script", [CHECK, FETCH], ids=lambda p: p.name)
def test_the_scripts_parse(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@needs_bash
def test_the_default_run_fits_the_device_command_setup_included() -> None:
    plan = _plan()
    names = [n for n, _ in plan]
    assert names == [*SETUP, *DEFAULT_PARTS, "summary"]
    total = sum(s for _, s in plan)
    assert total <= COMMAND_LIMIT_S, plan
    preflight = dict(plan)["preflight"]
    assert preflight <= 20


@needs_bash
@pytest.mark.parametrize("part", sorted(OTHER_PARTS))
def test_each_part_behind_parts_fits_alone(part: str) -> None:
    plan = _plan(part)
    assert [n for n, _ in plan] == [*SETUP, *OTHER_PARTS[part], "summary"]
    assert sum(s for _, s in plan) <= COMMAND_LIMIT_S, plan


@needs_bash
def test_every_timeout_in_the_script_is_in_the_plan() -> None:
    # Steps run under `timeout "$seconds"`; any literal timeout beside them
    # is one the dry run must print too, or the plan undercounts.
    literal = [int(t) for t in re.findall(r"\btimeout (\d+) ", CHECK.read_text())]
    plan = dict(_plan())
    assert sorted(literal) == sorted([plan["gpu-name"], plan["cu13-lib"]])


@needs_bash
def test_every_step_in_the_script_is_in_some_plan() -> None:
    # A step the dry run never prints (behind a condition it skips) would
    # escape the sums above.
    written = set(
        re.findall(r"^\s*(?:if ! )?step ([\w-]+) (\d+) ", CHECK.read_text(), re.M)
    )
    planned = set(_plan())
    for part in OTHER_PARTS:
        planned |= set(_plan(part))
    printed_only = {"gpu-name", "cu13-lib"}  # literal timeouts, counted above
    assert {(n, str(s)) for n, s in planned if n not in printed_only} == written


@needs_bash
def test_an_unknown_part_is_refused() -> None:
    done = subprocess.run(
        ["bash", str(CHECK)],
        capture_output=True,
        text=True,
        env=_env(GPU_CHECK_DRY="1", PARTS="nonsense"),
    )
    assert done.returncode == 2 and "unknown part nonsense" in done.stderr
    assert "step" not in done.stdout  # refused before the setup's steps


def test_the_files_it_names_exist() -> None:
    text = CHECK.read_text()
    # Run only where it is there (the stage's benchmark is optional).
    optional = {"benchmarks/decode_stage_host.py"}
    for path in set(re.findall(r"(?:tests|benchmarks)/[\w/]+\.py", text)) - optional:
        assert (ROOT / path).is_file(), path


def test_the_wheels_are_the_pinned_ones() -> None:
    pins = dict(re.findall(r'"(nvidia-[\w-]+)==([\w.]+)"', FETCH.read_text()))
    assert pins["nvidia-nvimgcodec-cu13"] == "0.9.0.20"
    # Region decode with fancy upsampling is wrong before nvJPEG 13.2.
    major, minor = (int(x) for x in pins["nvidia-nvjpeg"].split(".")[:2])
    assert (major, minor) >= (13, 2)
    # The gpu extra installs the same ones where it pins them.
    extra = re.search(
        r"^gpu = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S
    )
    assert extra is not None
    for name, version in re.findall(r'"(nvidia-[\w-]+)==([\w.]+)"', extra.group(1)):
        if name in pins:
            assert pins[name] == version, (name, version)


def test_the_wheels_are_ignored_by_git() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(
        ["git", "check-ignore", "-q", "benchmarks/wheels/x.whl"], cwd=ROOT
    )
    assert done.returncode == 0
    assert "benchmarks/wheels" in FETCH.read_text()


# ------------------------------------------------- on nvImageCodec's CPU backend


@pytest.fixture(scope="module")
def bench_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("PIL")
    pytest.importorskip("matplotlib")
    from fastq._bench.train_data import make_files

    root = tmp_path_factory.mktemp("files")
    make_files(str(root), 8, 224)
    return root


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )


def test_the_engine_benchmark_runs_on_the_cpu_backend(
    bench_files: Path, tmp_path: Path
) -> None:
    pytest.importorskip("nvidia.nvimgcodec")
    report_path = tmp_path / "engine.json"
    done = _run(
        "decode_engine.py",
        "--device=cpu",
        "--files=8",
        "--batch=4",
        "--seconds=0",
        "--cpu-threads=1",
        f"--data={bench_files}",
        f"--json={report_path}",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(report_path.read_text())
    assert {"device", "files", "batch", "cpu_threads", "versions", "rows"} <= set(
        report
    )
    rows = {r["name"]: r for r in report["rows"]}
    for name in ("cpu-whole", "cpu-boxes", "cpu-two-decoders"):
        r = rows[name]
        assert r["error"] is None and r["skipped"] is None, r
        assert r["images"] >= 8 and r["images_per_s"] > 0, r
        assert r["thread_cpu_us_per_image"] > 0 and r["process_cpu_us_per_image"] > 0
        assert {"jpg_percent", "jpg_samples", "rejected", "seconds"} <= set(r)
    assert rows["hw-boxes"]["skipped"] == "needs --device cuda"


def test_the_box_check_passes_the_cpu_backend(
    bench_files: Path, tmp_path: Path
) -> None:
    pytest.importorskip("nvidia.nvimgcodec")
    report_path = tmp_path / "pixels.json"
    done = _run(
        "decode_box_pixels.py",
        "--device=cpu",
        "--decoder=direct",
        "--samples=8",
        "--files=8",
        f"--data={bench_files}",
        f"--json={report_path}",
    )
    report = json.loads(report_path.read_text())
    assert done.returncode == 0 and report["ok"], done.stdout + done.stderr
    assert report["samples"] == 8 and report["wrong_shape"] == 0


def test_the_box_check_fails_a_shifted_or_misshapen_box(bench_files: Path) -> None:
    pytest.importorskip("PIL")
    import decode_box_pixels as px
    from decode_engine import load_samples

    s = load_samples(str(bench_files), 1)[0]
    ref = px.pillow_box(s)
    assert px.compare(0, s, ref).ok()
    top, left, h, w = s.box
    shifted = px.pillow_box(px.replace(s, box=(top, left + 3, h, w)))
    assert not px.compare(0, s, shifted).ok()
    assert not px.compare(0, s, ref[1:]).ok()
    assert not px.compare(0, s, None).ok()


# ----------------------------------------------------------- what it reads


def test_the_preflight_reads_the_doctor() -> None:
    from gpu_preflight import doctor_verdict, unpack_opened

    def doctor(**entry: Any) -> dict[str, Any]:
        return {"backends": {"nvimgcodec": {"version": "0.9.0", **entry}}}

    assert doctor_verdict(doctor(opens=True, probe_ok=True))[0] is True  # type: ignore[index]
    assert doctor_verdict(doctor(opens=True, probe_ok=False))[0] is False  # type: ignore[index]
    off = doctor(opens={"gpu": False, "cpu": True}, probe_ok=True, why="no GPU")
    assert doctor_verdict(off, "cuda")[0] is False  # type: ignore[index]
    assert doctor_verdict(off, "cpu")[0] is True  # type: ignore[index]
    assert doctor_verdict({"backends": {}}) is None
    assert doctor_verdict("usage: ...") is None
    assert unpack_opened((None, "why")) == (None, "why")
    marker = object()
    assert unpack_opened(marker) == (marker, "")


def test_dmon_samples_are_read_by_their_jpg_column() -> None:
    from jpg_utilization import parse_dmon, window_mean

    text = """\
#Time        gpu     sm    mem    enc    dec    jpg    ofa
#HH:MM:SS    Idx      %      %      %      %      %      %
 00:00:10      0      5      1      0      0     40      0
 00:00:11      0      5      1      0      0     60      0
 00:00:12      0      5      1      0      0      -      0
 00:00:13      0      5      1      0      0     10      0
"""
    samples = parse_dmon(text.splitlines(), day_start=1000.0)
    assert samples == [(1010.0, 40.0), (1011.0, 60.0), (1013.0, 10.0)]
    assert window_mean(samples, 1009.2, 1011.5) == (50.0, 2)
    assert window_mean(samples, 1012.5, 1012.7) == (10.0, 1)  # shorter than a sample
    assert window_mean(samples, 1020.0, 1030.0) == (None, 0)
    assert parse_dmon(["#Time gpu sm mem", " 00:00:01 0 1 1"], 0.0) == []


def test_the_summary_passes_and_fails_each_target(tmp_path: Path) -> None:
    import gpu_summary

    gpu = "H"
    (tmp_path / f"preflight-{gpu}.txt").write_text("preflight ok: opens\n")
    engine = {"rows": [{"name": "hw-boxes", "images": 10, "images_per_s": 9000.0}]}
    (tmp_path / f"engine-{gpu}.json").write_text(json.dumps(engine))

    def row(
        loader: str, rate: float, cpu: float, first: float | None
    ) -> dict[str, Any]:
        return {
            "section": "train",
            "config": {"loader": loader},
            "images_per_s": rate,
            "worker_cpu_us": cpu,
            "first_batch_s": first,
            "error": None,
        }

    results = [
        row("DataLoader", 4800.0, 2000.0, 0.80),
        row("GPU decode: nvImageCodec", 10500.0, 400.0, 0.95),
        row("ceiling", 11100.0, 0.0, None),
    ]
    (tmp_path / f"resnet18-{gpu}.json").write_text(json.dumps({"results": results}))
    verdicts = {t.target: t.verdict for t in gpu_summary.summarize(str(tmp_path), gpu)}
    assert verdicts["nvImageCodec backend opens"] == "pass"
    assert next(v for k, v in verdicts.items() if k.startswith("engine rate")) == "pass"
    assert next(v for k, v in verdicts.items() if "ceiling" in k) == "pass"
    assert next(v for k, v in verdicts.items() if "workers'" in k) == "pass"
    assert next(v for k, v in verdicts.items() if "first batch" in k) == "fail"
    assert next(v for k, v in verdicts.items() if "Pillow" in k) == "not measured"


class _BoxDecoder:
    """A decoder of the backend's interface, on nvImageCodec's CPU backend:
    what the preflight and the box check call fastq's backend through."""

    name = "nvimgcodec"
    crops = True
    takes_other_kinds = True

    def __init__(self, shift: int = 0) -> None:
        from nvidia import nvimgcodec as nv

        self._nv = nv
        self._shift = shift  # a wrong box, for the check to catch
        self._decoder = nv.Decoder(
            device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
            backends=[nv.Backend(nv.BackendKind.CPU_ONLY)],
        )
        self._params = nv.DecodeParams(
            color_spec=nv.ColorSpec.SRGB, apply_exif_orientation=False
        )

    def decode(self, data: Any, boxes: Any, stream: Any) -> list[Any]:
        import numpy as np
        import torch

        nv = self._nv
        sources = [
            nv.CodeStream(d).get_sub_code_stream(
                region=nv.Region(t, x + self._shift, t + h, x + self._shift + w)
            )
            for d, (t, x, h, w) in zip(data, boxes.tolist())
        ]
        images = self._decoder.decode(sources, params=self._params)
        return [
            None
            if im is None
            else torch.from_numpy(np.array(im.cpu())).permute(2, 0, 1)
            for im in images
        ]


@pytest.fixture
def ported_backend(monkeypatch: pytest.MonkeyPatch) -> Any:
    """fastq's open_decoder answering with _BoxDecoder (the shift it is
    given), as the backend on the 0.9 API answers."""
    pytest.importorskip("nvidia.nvimgcodec")
    pytest.importorskip("torch")
    from fastq.torch import _decoders

    def use(shift: int = 0) -> None:
        monkeypatch.setattr(
            _decoders, "open_decoder", lambda name, device: (_BoxDecoder(shift), "")
        )

    return use


def test_the_preflight_passes_a_backend_that_decodes_the_probe(
    ported_backend: Any,
) -> None:
    from gpu_preflight import open_and_probe

    ported_backend()
    ok, why = open_and_probe("cpu")
    assert ok, why
    ported_backend(shift=-9)  # inside the picture, 9 pixels off
    ok, why = open_and_probe("cpu")
    assert not ok and "differs from Pillow" in why, why
    ported_backend(shift=9)  # past its right edge: not decoded
    ok, why = open_and_probe("cpu")
    assert not ok and "returned None" in why, why


def test_the_box_check_goes_through_fastqs_backend(
    ported_backend: Any, bench_files: Path
) -> None:
    import decode_box_pixels as px
    from decode_engine import load_samples

    samples = px.with_corner_boxes(load_samples(str(bench_files), 8))
    ported_backend()
    assert px.summary(px.run(samples, px.FastqDecoder("cpu"), 4))["ok"]
    ported_backend(shift=5)
    assert not px.summary(px.run(samples, px.FastqDecoder("cpu"), 4))["ok"]


def test_the_summary_finds_the_stages_host_figures(tmp_path: Path) -> None:
    import gpu_summary

    (tmp_path / "stage-host-H.txt").write_text("stage host time\n")
    figures = {"rows": [{"name": "batched", "host_us_per_image": 12.5}]}
    (tmp_path / "stage-host-H.json").write_text(json.dumps(figures))
    t = gpu_summary.stage(str(tmp_path), "H")
    assert t.verdict == "measured" and "host_us_per_image 12.5" in t.measured
    (tmp_path / "stage-host-H.txt").write_text("skipped: not in this checkout\n")
    assert gpu_summary.stage(str(tmp_path), "H").verdict == "not measured"


def test_the_summary_reads_a_bench_cut_short_from_its_progress(tmp_path: Path) -> None:
    import gpu_summary

    tail = "peak PSS 2969 MB"
    progress = [
        "[  1/4] train resnet18 w=15 DataLoader: 4,764 images/s, waiting 29%, loop "
        f"CPU 7.8 ms/step, first batch 0.85 s, workers' CPU 2,400 us/image, {tail}",
        "[  2/4] train resnet18 w=15 GPU decode: nvImageCodec: 10,100 images/s, "
        "waiting 3%, loop CPU 6.5 ms/step, first batch 0.91 s, workers' CPU 500 "
        f"us/image, {tail}",
        "[  3/4] train resnet18 w=15 ceiling: one batch, reused: 11,140 images/s, "
        f"waiting 0%, loop CPU 6.1 ms/step, workers' CPU 0 us/image, {tail}",
    ]
    (tmp_path / "resnet18-H.txt").write_text("\n".join(progress) + "\n")
    verdicts = {t.target: t for t in gpu_summary.training(str(tmp_path), "H")}
    share = next(t for k, t in verdicts.items() if "ceiling" in k)
    assert share.verdict == "pass" and share.measured.startswith("0.91"), share
    workers = next(t for k, t in verdicts.items() if "workers'" in k)
    assert workers.verdict == "pass" and workers.measured.startswith("0.21"), workers
    first = next(t for k, t in verdicts.items() if "first batch" in k)
    assert first.verdict == "pass" and first.measured.startswith("+0.060"), first
