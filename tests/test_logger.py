"""The dllogger-format logger writes parseable DLLL lines on rank 0 only."""
import datetime
import io
import time

from recsys.runtime.logger import DllLogger, StepTimer, read_dllogger_file


def test_dllogger_file_format(tmp_path):
    path = tmp_path / "logs" / "dlrm.json"
    out = io.StringIO()
    logger = DllLogger(str(path), enabled=True, stdout=out)
    logger.log_parameters({"batch_size": 64, "optimizer": "sgd"})
    logger.metadata("auc", {"unit": None, "format": "0:.5f"})
    logger.log(step=(), data={"auc": 0.7654321, "throughput": 1234.5})
    logger.log(step=(1, 10), data={"loss": 0.5})
    logger.close()

    lines = path.read_text().splitlines()
    assert all(line.startswith("DLLL {") for line in lines)
    records = list(read_dllogger_file(str(path)))
    assert [r["type"] for r in records] == ["LOG", "METADATA", "LOG", "LOG"]
    for record in records:
        float(record["timestamp"])
        float(record["elapsedtime"])
        datetime.datetime.fromisoformat(record["datetime"])
    assert records[0]["step"] == "PARAMETER" and records[0]["data"]["batch_size"] == 64
    assert records[1] == {**records[1], "metric": "auc", "metadata": {"unit": None, "format": "0:.5f"}}
    assert records[2]["step"] == [] and records[2]["data"] == {"auc": 0.7654321, "throughput": 1234.5}
    assert records[3]["step"] == [1, 10]
    assert "auc : 0.76543" in out.getvalue()


def test_a_record_without_echo_goes_to_the_file_only(tmp_path):
    path = tmp_path / "dlrm.json"
    out = io.StringIO()
    logger = DllLogger(str(path), enabled=True, stdout=out)
    logger.log(step=20, data={"loss": 0.25}, echo=False)
    logger.close()
    assert [(r["step"], r["data"]) for r in read_dllogger_file(str(path))] == [(20, {"loss": 0.25})]
    assert out.getvalue() == ""


def test_disabled_logger_writes_nothing(tmp_path):
    path = tmp_path / "rank1.json"
    out = io.StringIO()
    logger = DllLogger(str(path), enabled=False, stdout=out)
    logger.log(step=(), data={"auc": 0.5})
    logger.close()
    assert not path.exists() and out.getvalue() == ""


def test_step_timer_skips_warmup():
    timer = StepTimer(warmup_steps=2)
    for step in range(5):
        timer.step_done(step)
    assert timer.mean_step_time() >= 0.0
    assert timer.measured_steps == 3
    assert StepTimer(warmup_steps=10).mean_step_time() != StepTimer(warmup_steps=10).mean_step_time()  # NaN


def test_step_timer_measures_a_run_shorter_than_its_warmup_whole():
    """A run shorter than the warm-up (2 x --print_freq) still reports its step time: over the steps
    after the first, or the one step there is."""
    one = StepTimer(warmup_steps=10)
    time.sleep(0.02)
    one.step_done(0)
    assert 0.02 <= one.mean_step_time() < 1
    short = StepTimer(warmup_steps=10)
    short.step_done(0)  # the first step traces the graph: excluded once there are more
    for step in (1, 2):
        time.sleep(0.01)
        short.step_done(step)
    assert 0.01 <= short.mean_step_time() < 0.5 and short.measured_steps == 0


def test_step_timer_returns_each_measured_steps_seconds_after_its_warmup():
    """Wide & Deep's --benchmark logs each step's samples/s from the step after max(warmup, 1) on:
    the timer says nothing before its clock runs, then each step's own duration."""
    timer = StepTimer(warmup_steps=2)
    assert timer.step_done(0) is None and timer.step_done(1) is None  # the clock starts after step 2
    time.sleep(0.02)
    first = timer.step_done(2)
    second = timer.step_done(3)
    assert first is not None and 0.02 <= first < 1
    assert second is not None and 0 <= second < first
    assert timer.measured_steps == 0 and 0.01 <= timer.mean_step_time() < 1 and timer.measured_steps == 2
