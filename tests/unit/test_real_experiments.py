"""The real-backend runner's pure parts: scaling a condition to a backend, the fidelity
section of the results file, and the command's refusals."""

from __future__ import annotations

import http.server
import threading
from dataclasses import replace

import pytest

from floorguard.cli import main
from floorguard.experiments import Condition
from floorguard.experiments.conditions import mu_sat_of
from floorguard.experiments.fidelity import admission, drift, service_mean
from floorguard.experiments.real import RealBackend, backend_counters, backend_times, scaled
from floorguard.experiments.report import REAL_BEGIN, REAL_END, write_real_section
from floorguard.profiles import V100_MOE, save_profile


def _backend(tmp_path, mu_sat, profile=V100_MOE):
    path = tmp_path / "profile.yaml"
    save_profile(profile, path, measured={"mu_sat_per_s": mu_sat})
    return RealBackend.from_profile("http://127.0.0.1:1/", "m", path)


def test_a_condition_scales_by_measured_capacity_and_keeps_d_over_s_max(tmp_path):
    marquee = Condition()
    same = scaled(marquee, _backend(tmp_path, mu_sat_of("v100-moe", 4)))
    assert same.assured_rate == pytest.approx(6.0) and same.window_s == pytest.approx(1.0)
    assert same.deadline_ms == pytest.approx(1820.0)
    assert same.profile.endswith("profile.yaml")

    half = scaled(marquee, _backend(tmp_path, mu_sat_of("v100-moe", 4) / 2))
    assert (half.assured_rate, half.opp_rate) == pytest.approx((3.0, 8.0))
    assert (half.window_s, half.duration_s) == pytest.approx((2.0, 24.0))
    assert half.deadline_ms == pytest.approx(1820.0)  # same s_max(16): same deadline

    ceiling = V100_MOE.ceiling
    slower = replace(V100_MOE, ceiling=replace(ceiling, base_s=2 * ceiling.base_s,
                                               per_token_s=2 * ceiling.per_token_s))  # fmt: skip
    assert scaled(marquee, _backend(tmp_path, 9.0, slower)).deadline_ms == pytest.approx(3640.0)
    assert scaled(marquee, _backend(tmp_path, 9.0), duration_s=5).duration_s == 5


def test_a_profile_without_a_measured_capacity_is_refused(tmp_path):
    path = tmp_path / "p.yaml"
    save_profile(V100_MOE, path)
    with pytest.raises(Exception, match="mu_sat_per_s"):
        RealBackend.from_profile("http://x", "m", path)


def test_the_fidelity_section_is_replaced_in_place_and_kept_by_the_simulator_report(tmp_path):
    results = tmp_path / "results.md"
    results.write_text("# Results\n\nsimulator tables\n")
    write_real_section(results, "first")
    write_real_section(results, "second")
    text = results.read_text()
    assert text.count(REAL_BEGIN) == 1 and "first" not in text and "second" in text
    assert text.startswith("# Results\n\nsimulator tables\n")

    assert main(["experiment", "run", "E3", "--reps", "1", "--out", str(tmp_path / "o"),
                 "--results-md", str(results)]) == 0  # fmt: skip
    text = results.read_text()
    assert "## E3" in text and text.count(REAL_BEGIN) == 1
    assert (
        text.index("## E3") < text.index(REAL_BEGIN) < text.index("second") < text.index(REAL_END)
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["E2", "--backend", "http://127.0.0.1:1", "--model", "m", "--profile", "P"],
         "simulator only"),
        (["E1", "--backend", "http://127.0.0.1:1"], "--backend needs --model"),
        (["E1", "--model", "m"], "go with --backend"),
        (["E1", "--backend", "http://127.0.0.1:1", "--model", "m", "--profile", "P",
          "--duration-s", "0"], "must be > 0"),
    ],
)  # fmt: skip
def test_the_real_backend_command_refuses_what_it_cannot_run(argv, message, tmp_path, capsys):
    profile = tmp_path / "p.yaml"
    save_profile(V100_MOE, profile, measured={"mu_sat_per_s": 9.0})
    argv = [str(profile) if a == "P" else a for a in argv]
    assert main(["experiment", "run", *argv, "--out", str(tmp_path / "o")]) != 0
    assert message in capsys.readouterr().err


VLLM_METRICS = """\
# HELP vllm:request_inference_time_seconds Histogram of time spent in RUNNING phase for request.
# TYPE vllm:request_inference_time_seconds histogram
vllm:request_inference_time_seconds_bucket{engine="0",le="+Inf",model_name="mid"} %(n)d
vllm:request_inference_time_seconds_count{engine="0",model_name="mid"} %(n)d
vllm:request_inference_time_seconds_sum{engine="0",model_name="mid"} %(service)f
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="mid"} %(n)d
vllm:request_queue_time_seconds_count{engine="0",model_name="mid"} %(n)d
vllm:request_queue_time_seconds_sum{engine="0",model_name="mid"} %(queue)f
"""


@pytest.fixture
def metrics_server():
    """A loopback HTTP server whose /metrics answers what the test sets."""
    state = {"body": b"", "status": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(state["status"])
            self.end_headers()
            self.wfile.write(state["body"])

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", state
    server.shutdown()
    server.server_close()


def test_the_backends_own_service_during_a_run_comes_from_vllms_histograms(metrics_server):
    url, state = metrics_server
    state["body"] = (VLLM_METRICS % {"n": 10, "service": 4.0, "queue": 1.0}).encode()
    before = backend_counters(url)
    state["body"] = (VLLM_METRICS % {"n": 30, "service": 16.0, "queue": 1.5}).encode()
    during = backend_times(before, backend_counters(url))
    assert during == {
        "backend_requests": 20,
        "backend_service_mean_s": pytest.approx(0.6),
        "backend_queue_mean_s": pytest.approx(0.025),
    }
    state["body"] = b"<html>not metrics</html>"
    assert backend_counters(url) is None
    state["status"] = 404
    assert backend_counters(url) is None
    assert backend_counters("http://127.0.0.1:1") is None  # nothing listening
    assert backend_times(None, before)["backend_service_mean_s"] is None


def test_runs_on_a_backend_off_its_calibrated_speed_are_named():
    def row(condition, rep, service, served=True):
        return {"condition": condition, "rep": rep, "served": served,
                "backend_requests": 50, "backend_service_mean_s": service}  # fmt: skip

    sim = [row(0, rep, 0.4) for rep in range(3)]
    steady = [row(0, 0, 0.42), row(0, 1, 0.38), row(0, 2, 0.44)]
    assert "no run was more than 25% off it" in drift(steady, sim)
    slowed = [row(0, 0, 0.42), row(0, 1, 0.6), row(0, 2, 0.2), row(0, 2, 9.0, served=False)]
    text = drift(slowed, sim)
    assert "2 of 3 runs were more than 25% off it** (1 faster, 1 slower)" in text
    assert "c0 rep 1 (1.50)" in text and "c0 rep 2 (0.50)" in text
    assert "0.50–1.50 ×" in text
    assert drift([{**r, "backend_service_mean_s": None} for r in slowed], sim) == ""
    assert service_mean(steady) == pytest.approx(0.4133, abs=1e-4)


def test_whether_the_fifo_runs_admitted_what_the_assured_first_runs_did_is_said():
    assert admission([{"policy": "guard"}]) == ""
    assert "in 2 of 2 runs: the two orders were compared on identical" in admission(
        [{"admission_identical": True}, {"admission_identical": True}, {"policy": "guard"}]
    )
    text = admission([{"admission_identical": True}, {"admission_identical": False}])
    assert "in 1 of 2 runs" in text and "similar, not identical" in text
