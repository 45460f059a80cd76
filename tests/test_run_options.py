"""A run option is declared once, as a RunConfig field: every field is a YAML key, a `run`
flag, a `sweep` flag and a Trainer.fit keyword, and they all give the same config."""
import ast
import dataclasses
import inspect
import typing
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO

import exoframe
from exoframe import testing
from exoframe.cli.config_flags import is_axis, overrides, sweep_values
from exoframe.cli.run_command import run
from exoframe.cli.sweep_command import sweep
from exoframe.config import RunConfig, resolve_config
from exoframe.engine.plan.fit_keywords import ALIASES, REFUSED, fit_config
from exoframe.errors import ExoframeError
from exoframe.fields import api_default, field_default, option_of, sweep_flag, value_type

FIELDS = dataclasses.fields(RunConfig)
HINTS = typing.get_type_hints(RunConfig)
# Text fields that validate() reads: a valid value other than the default.
VALID_TEXT = {"workload": "mlp", "strategy": "diloco", "optimizer": "sgd", "device": "auto",
              "partition": "dirichlet:0.5", "time_budget": "2h", "net": "wan-1gbps",
              "compute": "fixed:10ms", "stragglers": "1:2", "faults": "1@1s:1s"}


def sample(f):
    """(a value of field f other than its default, the argv giving it as a `run` flag)."""
    opt, kind, default = option_of(f), value_type(f, HINTS), field_default(f)
    option = next(p for p in run.params if p.name == f.name)
    if kind is bool:
        return not default, [(option.secondary_opts if default else option.opts)[0]]
    if opt.choices:
        value = opt.choices[-1]
    elif kind is int:
        value = default + 1 if isinstance(default, int) else 3
    elif kind is float:
        value = 0.5
    elif kind is dict:
        return {"k": 1}, [option.opts[0], "k=1"]
    elif kind is list:
        return ["csv"], [option.opts[0], "csv"]
    else:
        value = VALID_TEXT.get(f.name, f"not-{default}")
    return value, [option.opts[0], str(value)]


def field_values(command, argv) -> dict:
    """What `command` parses from argv for RunConfig's fields (the command's other
    arguments left out), without running it."""
    params = command.make_context(command.name, list(argv)).params
    return {f.name: params[f.name] for f in FIELDS}


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_every_field_is_a_yaml_key_a_run_flag_a_sweep_flag_and_a_fit_keyword(f, tmp_path):
    value, argv = sample(f)
    assert value != field_default(f)
    expected = resolve_config(None, {f.name: value})
    assert getattr(expected, f.name) == value

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({f.name: value}))
    assert resolve_config(path) == expected

    flags = field_values(run, argv)
    assert resolve_config(None, overrides(flags)) == expected

    if option_of(f).sweep is None:  # one value: the same flag, for every run of the sweep
        flags = field_values(sweep, argv)
        flags.pop("strategy_params")  # (a sweep scopes -p by strategy: experiments/sweep.py)
        given, axes = sweep_values(flags)
        if f.name != "strategy_params":
            assert resolve_config(None, given) == expected
    if is_axis(f):  # several values, each a run of its own
        flag = sweep_flag(f)
        argv = ([flag, str(value), flag, str(value)] if option_of(f).commas
                else [flag, f"{value},{value}"])
        given, axes = sweep_values(field_values(sweep, argv))
        assert given == {} and axes == {f.name: [value, value]}
    elif value_type(f, HINTS) is dict:  # KEY=V1,V2: each value a run of its own
        given, axes = sweep_values(field_values(sweep, [argv[0], "k=1,[2,3]", argv[0], "j=4"]))
        assert axes == {(f.name, "k"): [1, [2, 3]]} and given[f.name] == {"j": 4}

    if f.name in REFUSED:  # the Trainer's own model and data are its workload
        with pytest.raises(ExoframeError, match=f"Trainer.fit: {f.name}: a Trainer trains"):
            fit_config("ddp", {f.name: value}, batch_size=None)
        return
    strategy = value if f.name == "strategy" else "ddp"
    options = {} if f.name == "strategy" else {f.name: value}
    config, cls, out = fit_config(strategy, options, batch_size=None)
    assert (config, cls) == (expected, None)
    assert out == (value if f.name == "out" else None)


def test_fit_defaults_are_the_fields_defaults():
    signature = inspect.signature(exoframe.Trainer.fit).parameters
    for f in FIELDS:
        if f.name not in REFUSED:
            assert signature[f.name].default == api_default(f)
    assert api_default(next(f for f in FIELDS if f.name == "out")) is None  # no run folder
    config, _, out = fit_config("ddp", {}, batch_size=None)
    assert config == RunConfig().validate() and out is None


def test_exo_gym_keywords_are_taken_or_refused_in_one_line():
    import torch

    taken = {"num_nodes": 3, "num_epochs": 2, "val_interval": 5, "checkpoint_interval": 4,
             "inner_optim": "sgd", "device": "auto"}
    ours = {ALIASES.get(k, k): v for k, v in taken.items()}
    assert fit_config("ddp", taken, 8) == fit_config("ddp", ours, 8)
    assert fit_config("ddp", {"max_steps": 7}, 8)[0].steps == 7
    assert fit_config("ddp", {"inner_optim": torch.optim.SGD}, 8)[0].optimizer == "sgd"
    for key, spelling in [("autocast", "precision="), ("minibatch_size", "accumulate="),
                          ("val_size", "val_examples="), ("devices", "device="),
                          ("save_dir", "out=")]:
        with pytest.raises(ExoframeError) as refused:
            fit_config("ddp", {key: 1}, 8)
        assert spelling in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(ExoframeError, match="num_epochs and max_steps: .* give one"):
        fit_config("ddp", {"num_epochs": 1, "max_steps": 3}, 8)
    with pytest.raises(ExoframeError, match="both give steps"):
        fit_config("ddp", {"max_steps": 3, "steps": 3}, 8)
    with pytest.raises(ExoframeError, match="unknown argument 'max_stepz'. Did you mean "
                                            "'max_steps'"):
        exoframe.Trainer(testing.tiny_model(), testing.tiny_data()).fit(max_stepz=3)


def test_a_strategy_called_with_its_parameters_trains_exactly_as_its_name():
    from exoframe.strategies import DiLoCo, StreamingDiLoCo

    run = dict(num_nodes=2, steps=6, net="wan-100mbps", compute="fixed:10ms", eval_every=3,
               optimizer="sgd", lr=0.1)
    results = [exoframe.Trainer(testing.tiny_model(), testing.tiny_data(), batch_size=8)
               .fit(strategy=strategy, **params, **run)
               for strategy, params in [("diloco", {"strategy_params": {"H": 2}}),
                                        (DiLoCo(H=2), {}),
                                        (DiLoCo, {"strategy_params": {"H": 2}})]]
    named = results[0]
    assert named.summary["bytes_sent_per_node"] > 0  # three outer syncs went over the network
    for other in results[1:]:
        assert other.metrics == named.metrics  # losses and simulated times, bit for bit
        assert other.summary["simulated_seconds"] == named.summary["simulated_seconds"]
        assert other.summary["strategy"] == "diloco"
        assert testing.max_difference(other, named) == 0
    # A registered class runs under its registered name; parameters are checked at once.
    assert fit_config(StreamingDiLoCo(H=4), {}, 8)[0].strategy == "streaming-diloco"
    with pytest.raises(ExoframeError, match="unknown parameter 'Hx'. Did you mean 'H'"):
        DiLoCo(Hx=2)
    with pytest.raises(ExoframeError, match="carries its parameters"):
        fit_config(DiLoCo(H=2), {"strategy_params": {"H": 3}}, 8)


def test_a_swept_fields_values_are_checked_as_the_field():
    with pytest.raises(ExoframeError, match="--seeds: field 'seed' must be int"):
        sweep_values(field_values(sweep, ["--seeds", "0,x"]))


def declared_flags(path: Path) -> set[str]:
    """The flags a module declares: click.option's, and RunConfig's in option()/Sweep()."""
    flags = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", None))
        texts = []
        if name == "option" and getattr(node.func, "value", None) is not None:  # click.option
            texts = [a.value for a in node.args if isinstance(a, ast.Constant)]
        elif name in ("option", "Sweep"):  # a field's metadata
            texts = [k.value.value for k in node.keywords
                     if k.arg in ("flag", "short") and isinstance(k.value, ast.Constant)]
        flags |= {t for text in texts if isinstance(text, str) and text.startswith("-")
                  for t in text.split("/")}
    return flags


def test_no_flag_is_declared_in_more_than_one_file():
    files = sorted((REPO / "exoframe").rglob("*.py"))
    where = {}
    for path in files:
        for flag in declared_flags(path):
            where.setdefault(flag, set()).add(path.relative_to(REPO).as_posix())
    for f in FIELDS:  # a field's flag made from its name is declared by config.py
        for option in (p for p in run.params if p.name == f.name):
            for flag in option.opts + option.secondary_opts:
                where.setdefault(flag, set()).add("exoframe/config.py")
    assert {"-p", "--param", "--config", "--debug", "--seeds"} <= set(where)
    twice = {flag: sorted(files) for flag, files in where.items() if len(files) > 1}
    assert not twice, f"flags declared in more than one file: {twice}"


def test_a_job_is_frozen_and_what_is_learnt_later_makes_a_new_one():
    """The FLOP count of a step is counted once the model and a batch exist (launcher's
    prepare): it is a new Job, and each run resolves its own network setup."""
    from exoframe.engine import job_from_config
    from exoframe.engine.plan.flops import count_step_flops
    from exoframe.engine.launch.launcher import prepare

    config = resolve_config(None, {"workload": "mlp", "compute": "flops:cpu", "steps": 2})
    job, other = job_from_config(config), job_from_config(config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.steps = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.sim.compute = None
    assert job.sim is not other.sim  # one network setup per run
    prepared, batches, _ = prepare(job)
    compute = prepared.sim.compute
    assert prepared is not job and job.sim.compute.needs_flops and not compute.needs_flops
    flops = count_step_flops(job.model, batches[0].first())
    assert compute.step_seconds == flops / (compute.peak * compute.efficiency)
    assert other.sim.compute.needs_flops


def test_a_job_declares_every_attribute_it_has():
    """The Job's attributes are its declared fields and properties, none copied into it when
    it is made: a config field the Job does not resolve and the ranks read is a property
    giving the config's own value; any other is read as job.config.<field>; an option the
    Job resolves (steps from epochs, the network, the faults...) is only its resolved value."""
    from exoframe.engine import job_from_config
    from exoframe.engine.plan.job import Job

    config = resolve_config(None, {"workload": "mlp", "seed": 7, "accumulate": 2,
                                   "schedule": "cosine", "epochs": 1})
    job = job_from_config(config)
    fields = {f.name for f in dataclasses.fields(job)}
    assert set(vars(job)) == fields  # nothing but its fields in its __dict__
    properties = {name for name, value in vars(Job).items() if isinstance(value, property)}
    for f in dataclasses.fields(RunConfig):
        if f.name in properties and f.name != "device":
            assert getattr(job, f.name) is getattr(config, f.name), f.name
        elif f.name not in fields | properties:
            assert not hasattr(job, f.name), f.name  # read as job.config.<field>
    assert (job.seed, job.accumulate, job.schedule) == (7, 2, "cosine")
    assert job.steps != config.steps  # resolved from epochs: the Job's own
    with pytest.raises(AttributeError):
        job.no_such_field


def test_each_fit_of_a_trainer_starts_from_the_model_as_given():
    """Two fits of one Trainer with the same arguments give the same records; warm_start
    goes on from the last fit's model; the given model is left as it was."""
    model = testing.tiny_model()
    given = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = exoframe.Trainer(model, testing.tiny_data(), batch_size=8)
    run = dict(num_nodes=2, steps=4, net="wan-100mbps", compute="fixed:10ms", eval_every=2,
               optimizer="sgd", lr=0.1, strategy_params={"H": 2})
    first, second = (trainer.fit("diloco", **run) for _ in range(2))
    assert second.metrics == first.metrics  # losses and simulated times, bit for bit
    assert testing.max_difference(first, second) == 0
    assert first.model is not second.model  # the second fit left the first's result alone
    assert all(torch.equal(v, given[k]) for k, v in model.state_dict().items())
    warm = trainer.fit("diloco", warm_start=True, **run)
    assert warm.metrics[0]["loss"] < first.metrics[0]["loss"]  # it went on from `second`
    with pytest.raises(ExoframeError, match="resume= .* warm_start=True .* give one"):
        trainer.fit("diloco", warm_start=True, resume="somewhere", **run)


def test_config_yaml_is_the_same_from_run_fit_and_a_sweep(tmp_path):
    """config.yaml is written one way (Job.config_record), whoever starts the run: the same
    options give the same record from `exoframe run`, Trainer.fit and a sweep's run, with
    what the Job resolved (the strategy's parameters with their defaults, the workload's
    batch size and learning rate, the validation interval), but for the folder it names and,
    from Trainer.fit, the workload (its model and data came from Python)."""
    from exoframe.cli import main
    from exoframe.workloads.mlp import mlp

    def recorded(folder):
        (config,) = folder.glob("**/config.yaml")
        return yaml.safe_load(config.read_text())

    common = ["--nodes", "2", "--steps", "2", "--compute", "fixed:10ms", "--net", "wan-100mbps",
              "--time-budget", "1h", "--partition", "dirichlet:0.5", "--stragglers", "1:2",
              "--faults", "1@1h:1s", "--no-progress"]
    workload = ["--workload", "mlp", "-w", "hidden=16", "-w", "train_examples=512"]
    main(["run", *workload, "--strategy", "diloco", "-p", "H=2", *common,
          "--out", str(tmp_path / "run")])
    main(["sweep", *workload, "--strategy", "diloco", "-p", "diloco.H=2", *common,
          "--no-plots", "--out", str(tmp_path / "sweep")])
    given = mlp(hidden=16, train_examples=512)
    exoframe.Trainer(given.build_model(), given.dataset, batch_size=given.batch_size).fit(
        "diloco", num_nodes=2, steps=2, compute="fixed:10ms", net="wan-100mbps",
        time_budget="1h", partition="dirichlet:0.5", stragglers="1:2", faults="1@1h:1s",
        strategy_params={"H": 2}, out=str(tmp_path / "fit"))
    run, swept, fit = (recorded(tmp_path / name) for name in ("run", "sweep", "fit"))
    assert run["strategy_params"]["H"] == 2 and len(run["strategy_params"]) > 1  # defaults too
    assert (run["batch_size"], run["lr"], run["eval_every"]) == (64, 1e-3, 1)  # resolved
    assert (run["time_budget"], run["partition"], run["faults"]) == (  # as given
        "1h", "dirichlet:0.5", "1@1h:1s")

    def but(record, *names):
        return {k: v for k, v in record.items() if k not in names}
    assert but(swept, "out") == but(run, "out")
    assert fit["workload"] == "custom" and fit["workload_params"] == {}
    assert but(fit, "out", "workload", "workload_params") == \
        but(run, "out", "workload", "workload_params")
    assert list(fit) == list(run) == list(swept)  # (the same order of keys, too)
