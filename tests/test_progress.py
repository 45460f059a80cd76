"""Without a terminal (a batch job's log), a run says how far it got: a line every so often."""
import io
import re

from exoframe.engine.launch.progress import Lines


def test_lines_come_every_interval_and_once_at_the_end():
    now = [0.0]
    out = io.StringIO()
    lines = Lines(total=10, label="diloco ×4", every=30, out=out, clock=lambda: now[0])
    for step in range(1, 11):
        now[0] = 12.5 * step  # 30 s pass between steps 3 and 4, 5 and 6, 8 and 9
        lines.update(1, {"step": step, "loss": 2.0 / step, "sim_time": 1.5 * step,
                         **({"val_loss": 0.25} if step % 5 == 0 else {})})
    lines.close()
    lines.close()  # nothing new: nothing printed
    assert out.getvalue().splitlines() == [
        "diloco ×4: step 3/10 (30%)  loss 0.6667  sim 4.5 s  elapsed 37.5 s",
        "diloco ×4: step 6/10 (60%)  loss 0.3333  sim 9 s  elapsed 1.2 min",
        "diloco ×4: step 9/10 (90%)  loss 0.2222  sim 13.5 s  elapsed 1.9 min",
        "diloco ×4: step 10/10 (100%)  loss 0.2000  val 0.2500  sim 15.0 s  elapsed 2.1 min"]


def test_a_sweeps_next_run_shows_none_of_the_last_runs_numbers():
    now = [0.0]
    out = io.StringIO()
    lines = Lines(total=4, label="sweep", every=30, out=out, clock=lambda: now[0])
    lines.describe("sweep: ddp seed 0 on wan-1gbps")
    lines.update(1, {"step": 1, "loss": 2.5, "sim_time": 1.0})
    lines.describe("sweep: diloco seed 0 on wan-1gbps")
    now[0] = 31.0  # a line is due before diloco's first row
    lines.update(0)
    lines.update(1, {"step": 1, "loss": 1.25, "sim_time": 2.0})
    now[0] = 62.0
    lines.update(0)
    assert out.getvalue().splitlines() == [
        "sweep: diloco seed 0 on wan-1gbps: step 1/4 (25%)  elapsed 31.0 s",
        "sweep: diloco seed 0 on wan-1gbps: step 2/4 (50%)  loss 1.2500  sim 2 s  "
        "elapsed 1.0 min"]


def test_a_real_network_run_says_its_time_is_measured():
    out = io.StringIO()
    lines = Lines(total=2, label="ddp ×2", every=30, out=out, clock=lambda: 0.0, measured=True)
    lines.update(2, {"step": 2, "loss": 1.0, "sim_time": 3.0})
    lines.close()
    assert out.getvalue().splitlines() == [
        "ddp ×2: step 2/2 (100%)  loss 1.0000  measured 3 s  elapsed 0 s"]


def test_a_run_without_a_terminal_prints_progress_lines(cli):
    run = cli("run", "--workload", "mlp", "--nodes", "2", "--steps", "40", "--eval-every", "10",
              "--compute", "fixed:10ms", "--out", "runs", "--progress-every", "0.000001")
    assert run.returncode == 0, run.stderr_text
    lines = run.stderr_text.splitlines()
    steps = [int(re.match(r"ddp ×2: step (\d+)/40 \(\d+%\)  loss \d\.\d{4}", line).group(1))
             for line in lines]
    assert steps == list(range(1, 41))  # every step, as the interval is shorter than one
    assert lines[-1].startswith("ddp ×2: step 40/40 (100%)")
    assert "  sim 0.4 s  " in lines[-1]  # 40 steps of 10 ms, on the ideal network
    quiet = cli("run", "--workload", "mlp", "--nodes", "2", "--steps", "3", "--out", "runs",
                "--progress-every", "0")
    assert quiet.returncode == 0 and quiet.stderr_text == ""
