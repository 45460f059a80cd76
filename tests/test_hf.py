"""The hf extra: a transformers causal LM from a config, and a dataset saved by `datasets`,
trained with the network unreachable. Skipped when the extra is not installed."""
import json
import math

import pytest

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

# Started before anything else in each process of a run (sitecustomize): every connection
# but to this machine, and every name lookup but of it, fails, so a download cannot happen.
NO_NETWORK = '''
import socket

LOCAL = ("127.0.0.1", "::1", "localhost", "", None)
_connect, _getaddrinfo = socket.socket.connect, socket.getaddrinfo


def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in LOCAL:
        raise OSError(f"network blocked by the test: {address}")
    return _connect(self, address)


def getaddrinfo(host, *args, **kw):
    if host not in LOCAL:
        raise OSError(f"network blocked by the test: {host}")
    return _getaddrinfo(host, *args, **kw)


socket.socket.connect, socket.getaddrinfo = connect, getaddrinfo
'''

TINY = ["-w", "train_tokens=8000", "-w", "val_tokens=1000", "-w", "block_size=16"]


def offline_run(cli, *args):
    (cli.cwd / "offline").mkdir()
    (cli.cwd / "offline" / "sitecustomize.py").write_text(NO_NETWORK)
    env = {"PYTHONPATH": f"{cli.cwd / 'offline'}:{cli.env()['PYTHONPATH']}",
           "HF_HOME": str(cli.cwd / "hf-home")}  # no cache of the user's to fall back on
    proc = cli("run", "--nodes", "2", "--steps", "3", "--eval-every", "3", "--out", "runs",
               *args, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr_text
    (run,) = (cli.cwd / "runs").iterdir()
    return json.loads((run / "summary.json").read_text())


def test_a_transformers_model_from_its_type_and_sizes_trains_2_nodes_offline(cli):
    summary = offline_run(cli, "--workload", "hf-lm", "-w", "model_type=gpt2", *TINY,
                          "-w", "hidden_size=32", "-w", "num_hidden_layers=1",
                          "-w", "num_attention_heads=2")
    assert summary["workload"] == "hf-lm" and summary["steps"] == 3
    assert 0 < summary["final_val_loss"] < 5
    gpt2 = sizes_of("gpt2", {"n_embd": 32, "n_layer": 1, "n_head": 2})
    assert summary["bytes_sent_per_node"] > 3 * gpt2 * 4 * 0.9  # ddp: the gradients, 3 times


def sizes_of(model_type, sizes):
    """The hf-lm workload's parameter count, against transformers' own model for the config
    (random weights: the count is what shows the config was followed)."""
    from exoframe.workloads.hf import hf_lm

    workload = hf_lm(model_type=model_type, hidden_size=32, num_hidden_layers=1,
                     num_attention_heads=2, train_tokens=8000, val_tokens=1000, block_size=16)
    config = transformers.AutoConfig.for_model(model_type, vocab_size=32,
                                               max_position_embeddings=16, **sizes)
    expected = sum(p.numel() for p in
                   transformers.AutoModelForCausalLM.from_config(config).parameters())
    model = workload.build_model()
    assert sum(p.numel() for p in model.parameters()) == expected
    batch = next(iter(workload.dataset(0, 1, "train")))
    loss = model([batch[0].unsqueeze(0)])
    assert loss.dim() == 0 and abs(loss.item() - math.log(32)) < 0.5  # random init: ~ln V
    return expected


def test_a_llama_config_from_its_sizes():
    sizes_of("llama", {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "intermediate_size": 128})


def test_a_config_file_and_a_saved_dataset_train_offline(cli):
    config = transformers.AutoConfig.for_model("gpt2", n_embd=32, n_layer=1, n_head=2,
                                               n_positions=64)
    config.save_pretrained(cli.cwd / "model")
    text = ["the quick brown fox jumps over the lazy dog " * 20] * 40
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": text})}) \
        .save_to_disk(str(cli.cwd / "corpus"))
    summary = offline_run(cli, "--workload", "hf-lm", "-w", "config=model", "-w",
                          "data=corpus", "-w", "block_size=16")
    assert 0 < summary["final_val_loss"] < 5
    from exoframe.workloads.gpt import gpt

    windows = gpt(data=str(cli.cwd / "corpus"), block_size=16).dataset.train
    chars = sorted(set(text[0] + "\n"))
    first = "".join(chars[i] for i in windows[0][0].tolist())
    assert first == ("\n".join(text))[:17]


def test_sizes_given_go_over_the_config_file_and_unknown_ones_are_one_line(tmp_path):
    from exoframe.errors import ExoframeError
    from exoframe.workloads.hf import hf_lm

    transformers.AutoConfig.for_model("gpt2", n_embd=32, n_layer=1, n_head=2,
                                      n_positions=64).save_pretrained(tmp_path)
    small = dict(train_tokens=8000, val_tokens=1000, block_size=16)
    model = hf_lm(config=str(tmp_path), num_hidden_layers=3, **small).build_model()
    assert (model.model.config.n_layer, model.model.config.n_embd) == (3, 32)
    assert model.model.config.vocab_size == 32  # the data's, not gpt2's 50257
    with pytest.raises(ExoframeError, match="gpt2 configs have no 'n_layers'. Did you mean"):
        hf_lm(n_layers=3, **small)
