"""trainer.sft: masking, schedule, the solution-only loss, and a short run that learns 1-digit addition."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer import sft as sft_mod
from scoring.tasks import addition
from inference.tiny import build_model, build_tokenizer


@pytest.fixture(autouse=True)
def _one_thread():
    # the matrices are tiny and the 2 cores are shared: one thread avoids oversubscription stalls
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_collate_masks_prompt_and_padding(tok):
    rows = [{"prompt": "3+4\n", "solution": "3+4+0=7\n= 7"}, {"prompt": "12+5\n", "solution": "2+5+0=7\n1+0+0=1\n= 17"}]
    enc = sft_mod.encode_examples(tok, rows)
    assert enc[0] == (tok("3+4\n3+4+0=7\n= 7", add_special_tokens=False)["input_ids"] + [2], 4)
    batch = sft_mod.collate(enc, tok.pad_token_id)
    n0, n1 = len(enc[0][0]), len(enc[1][0])
    assert batch["input_ids"].shape == (2, max(n0, n1)) == (2, 5 + 20 + 1)
    assert batch["attention_mask"].sum(1).tolist() == [n0, n1]
    assert batch["input_ids"][0, n0:].eq(0).all()  # right padding with <pad>
    labels = batch["labels"]
    assert labels[0, :4].eq(-100).all() and labels[0, n0:].eq(-100).all()
    assert labels[0, 4:n0].tolist() == enc[0][0][4:]  # solution + EOS
    assert labels[1, :5].eq(-100).all() and labels[1, 5:].tolist() == enc[1][0][5:]


def test_warmup_cosine_schedule():
    f = lambda s: sft_mod.warmup_cosine(s, total=100, warmup=10)  # noqa: E731
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0) and f(10) == pytest.approx(1.0)
    assert f(55) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(100) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)


def test_loss_is_token_mean_over_solution_tokens(tok):
    model = build_model("1m", tok, seed=0).eval()
    rows = addition.make_examples(4, seed=0)
    batch = sft_mod.collate(sft_mod.encode_examples(tok, rows), tok.pad_token_id)
    with torch.no_grad():
        loss = model(**batch).loss
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # [B, L, V]
    # by hand: next-token log-loss at every position whose target is a solution token or EOS
    total, count = 0.0, 0
    for i, (ids, n_prompt) in enumerate(sft_mod.encode_examples(tok, rows)):
        for t in range(n_prompt, len(ids)):
            total += F.cross_entropy(logits[i, t - 1], torch.tensor(ids[t])).item()
            count += 1
    assert loss.item() == pytest.approx(total / count, rel=1e-5)


@pytest.mark.slow
def test_short_sft_learns_one_digit_addition(tok):
    """150 steps of 32 (≈14 s on one busy core): the solution loss drops >20x, greedy accuracy 0 -> >= 0.6.

    Measured (seed 0): loss 3.37 -> 0.031, greedy accuracy 0.00 -> 0.97; model seed 1: 3.37 -> 0.041, 0.82;
    100 steps: 3.23 -> 0.10, 0.67.
    """
    model = build_model("1m", tok, seed=0)
    train = addition.make_examples(2000, seed=0, min_digits=1, max_digits=1)
    heldout = addition.make_examples(100, seed=1, min_digits=1, max_digits=1)
    budget = sft_mod.response_budget(tok, heldout)
    before = sft_mod.accuracy(model, tok, heldout, addition.reward, max_new_tokens=budget)
    stats = sft_mod.sft(model, tok, train, steps=150, batch_size=32, lr=3e-3, seed=0, log_every=50, log=None)
    after = sft_mod.accuracy(model, tok, heldout, addition.reward, max_new_tokens=budget)
    assert before == 0.0
    assert len(stats["losses"]) == 150 and stats["tokens"] > 150 * 32 * 10
    assert stats["loss_first"] > 3.0  # ≈ ln(100) = 4.6 at init, averaged over the first 10 steps
    assert stats["loss_last"] < stats["loss_first"] / 20, stats
    assert after >= 0.6, after


def test_stop_loss_ends_early(tok):
    model = build_model("1m", tok, seed=0)
    rows = addition.make_examples(16, seed=0)
    stats = sft_mod.sft(model, tok, rows, steps=100, batch_size=4, lr=1e-3, seed=0, stop_loss=100.0, stop_window=5,
                        log=None)
    assert stats["steps"] == len(stats["losses"]) == 5 and stats["stopped_early"]
    stats = sft_mod.sft(model, tok, rows, steps=3, batch_size=4, lr=1e-3, seed=0, stop_loss=1e-9, log=None)
    assert stats["steps"] == 3 and not stats["stopped_early"]


def test_sft_cli_end_to_end(tmp_path, capsys):
    out = tmp_path / "sft"
    sft_mod.main(["--model", "1m", "--task", "addition", "--out", str(out), "--steps", "3", "--batch-size", "8",
                  "--n-train", "50", "--eval-n", "10", "--max-digits", "2", "--log-every", "1"])
    printed = capsys.readouterr().out
    assert "step 3/3" in printed and "held-out accuracy: greedy" in printed
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["steps"] == 3 and summary["difficulty"] == {"max_digits": 2} and summary["heldout_n"] == 10
    assert not (tmp_path / "sft.tmp").exists()
    # the output is an ordinary HF directory; it can be the --model of a further run
    model = AutoModelForCausalLM.from_pretrained(out)
    assert AutoTokenizer.from_pretrained(out).decode([21, 2], skip_special_tokens=True) == "0"
    assert model.config.model_type == "llama"
    sft_mod.main(["--model", str(out), "--task", "countdown", "--out", str(out), "--steps", "1", "--batch-size", "4",
                  "--n-train", "8", "--eval-n", "2"])
    assert json.loads((out / "sft_summary.json").read_text())["task"] == "countdown"
