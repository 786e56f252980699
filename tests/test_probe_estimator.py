"""The Monte-Carlo value estimator against values known exactly. With a reward that depends only
on a completion's FIRST token, the bare prompt's value is the softmax probability (at the run's
temperature) of the rewarded first tokens, computed here from the model's logits in float64, and
every longer prefix's value is determined: the estimates must sit within their SE of the first
and equal the second exactly (SE 0). Seeded probes repeat exactly and leave the caller's RNG alone."""
from __future__ import annotations

import json
import math

import pytest
import torch

from forksight.hooks.metrics.value_probe import ProbeInput, ProbeSettings, RewardError, probe

TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def setup(tiny_model_path, one_torch_thread):
    from forksight.trainer.model import load

    model, tok = load(tiny_model_path)
    model.eval()
    prompt = tok("12+34=").input_ids
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].double()
    p = torch.softmax(logits / TEMPERATURE, -1)
    order = p.argsort(descending=True).tolist()
    rewarded, total = set(), 0.0          # a value well inside (0, 1), without the most likely token
    for token in order[1:]:
        if total >= 0.4:
            break
        rewarded.add(token)
        total += float(p[token])
    exact = float(p[list(rewarded)].sum())
    completion = [order[0], order[2], order[-1], tok.eos_token_id]   # stored ids, as a run kept them
    return model, tok, prompt, completion, rewarded, exact


def _first_token_reward(rewarded):
    return lambda i, ids: 1.0 if ids and ids[0] in rewarded else 0.0


def test_values_are_exact_where_determined_and_within_their_se_where_sampled(setup):
    model, tok, prompt, completion, rewarded, exact = setup
    settings = ProbeSettings(k=400, positions="all", temperature=TEMPERATURE, max_new_tokens=8, seed=3,
                             fork_entropy=0.0)           # every token a fork: alternatives everywhere
    rows = probe(model, [ProbeInput(5, prompt, completion)], _first_token_reward(rewarded), settings,
                 eos_id=tok.eos_token_id, decode=lambda t: tok.decode([t]))
    assert [r["pos"] for r in rows] == [0, 1, 2, 3] and all(r["sample_id"] == 5 and r["k"] == 400 for r in rows)
    first = rows[0]
    # the bare prompt: binomial SE of 400 draws, the estimate within 4 of them of the exact value
    assert first["se_before"] == pytest.approx(math.sqrt(first["v_before"] * (1 - first["v_before"]) / 400))
    assert abs(first["v_before"] - exact) < 4 * first["se_before"]
    own = 1.0 if completion[0] in rewarded else 0.0
    for row in rows:            # every prefix holding a first token: determined, exactly
        assert row["v_after"] == own and row["se_after"] == 0.0
    for row in rows[1:]:
        assert row["v_before"] == own and row["delta"] == 0.0 and row["se"] == 0.0 and not row["pivotal"]
    assert first["delta"] == pytest.approx(own - first["v_before"])
    assert first["se"] == pytest.approx(first["se_before"])
    for before, after in zip(rows, rows[1:]):      # V(x, y<=t) is V(x, y<t+1): one estimate, shared
        assert before["v_after"] == after["v_before"]
    alts = json.loads(first["alternatives"])      # branch values at the first token: determined too
    assert len(alts) == 3 and completion[0] not in [a["token_id"] for a in alts]
    for alt in alts:
        assert alt["value"] == (1.0 if alt["token_id"] in rewarded else 0.0)
        assert alt["token"] == tok.decode([alt["token_id"]])
    assert rows[1]["token"] == tok.decode([completion[1]])


def test_the_bare_prompt_value_follows_the_softmax_when_eos_may_not_come_first(setup):
    model, tok, prompt, completion, rewarded, exact = setup
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].double()
    logits[tok.eos_token_id] = -math.inf                 # the run's min_new_tokens=1
    p = torch.softmax(logits / TEMPERATURE, -1)
    no_eos = float(p[list(rewarded)].sum())
    settings = ProbeSettings(k=400, positions=1, temperature=TEMPERATURE, max_new_tokens=8, seed=1,
                             first_token_eos=False)
    rows = probe(model, [ProbeInput(0, prompt, completion[:1])], _first_token_reward(rewarded), settings,
                 eos_id=tok.eos_token_id)
    assert abs(rows[0]["v_before"] - no_eos) < 4 * rows[0]["se_before"]


def test_a_seeded_probe_repeats_exactly_and_leaves_the_callers_rng_as_it_was(setup):
    model, tok, prompt, completion, rewarded, _ = setup
    reward = lambda i, ids: float(sum(ids) % 2)          # noqa: E731 - depends on the whole continuation
    settings = ProbeSettings(k=8, positions="all", temperature=TEMPERATURE, max_new_tokens=8, seed=11)
    inputs = [ProbeInput(0, prompt, completion), ProbeInput(1, prompt, completion[:2])]
    torch.manual_seed(123)
    one = probe(model, inputs, reward, settings, eos_id=tok.eos_token_id)
    after_one = torch.rand(3)
    torch.manual_seed(123)
    two = probe(model, inputs, reward, settings, eos_id=tok.eos_token_id)
    assert one == two
    torch.manual_seed(123)
    assert torch.equal(after_one, torch.rand(3))          # the probe drew nothing from the caller's stream
    other = probe(model, inputs, reward, ProbeSettings(**{**settings.__dict__, "seed": 12}), eos_id=tok.eos_token_id)
    assert [r["v_before"] for r in other] != [r["v_before"] for r in one]


def test_bad_settings_rewards_and_vocabularies_are_refused_naming_the_problem(setup):
    model, tok, prompt, completion, rewarded, _ = setup
    item = [ProbeInput(0, prompt, completion)]
    kw = dict(eos_id=tok.eos_token_id)
    with pytest.raises(ValueError, match="k .*>= 1"):
        probe(model, item, _first_token_reward(rewarded), ProbeSettings(k=0), **kw)
    with pytest.raises(ValueError, match="positions"):
        probe(model, item, _first_token_reward(rewarded), ProbeSettings(positions="some"), **kw)

    def boom(i, ids):
        raise KeyError("answer")
    with pytest.raises(RewardError, match="raised KeyError"):
        probe(model, item, boom, ProbeSettings(k=2, max_new_tokens=8), **kw)
    with pytest.raises(RewardError, match="'1.0' \\(str\\).*must return a number"):
        probe(model, item, lambda i, ids: "1.0", ProbeSettings(k=2, max_new_tokens=8), **kw)
    with pytest.raises(RewardError, match="finite"):
        probe(model, item, lambda i, ids: float("nan"), ProbeSettings(k=2, max_new_tokens=8), **kw)
    vocab = model.get_input_embeddings().weight.shape[0]
    with pytest.raises(ValueError, match=f"token id {vocab + 5}, outside this model's vocabulary of {vocab}"):
        probe(model, [ProbeInput(0, prompt, [vocab + 5])], _first_token_reward(rewarded), ProbeSettings(k=2), **kw)


def test_every_end_of_sequence_id_of_the_model_ends_a_prefix_and_a_continuation(setup):
    """A model whose generation_config lists a second EOS (Qwen2.5-Instruct lists two): a completion
    that ended on it is ended (its value determined, SE 0), and no continuation runs past it."""
    from forksight.hooks.metrics.value_probe import stop_ids

    model, tok, prompt, completion, _, _ = setup
    other = completion[1]                                  # a token the model samples: now an EOS too
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tok.eos_token_id, other]
    try:
        ids = stop_ids(model, tok)
        assert set(ids) == {tok.eos_token_id, other}
        scored: list[list[int]] = []

        def reward(i, c):
            scored.append(list(c))
            return float(len(c) % 2)
        rows = probe(model, [ProbeInput(0, prompt, completion[:2])], reward,
                     ProbeSettings(k=32, positions="all", temperature=1.5, max_new_tokens=8, seed=2), eos_id=ids)
    finally:
        model.generation_config.eos_token_id = saved
    last = rows[-1]
    assert last["pos"] == 1 and last["se_after"] == 0.0 and last["v_after"] == float(2 % 2)
    for c in scored:                   # each stops at its first end-of-sequence id, whichever it is
        ends = [j for j, t in enumerate(c) if t in ids]
        assert not ends or ends[0] == len(c) - 1, c
    assert any(c[-1] == other for c in scored[:-1] if len(c) < 8)   # the second EOS did stop some


def test_the_models_own_generation_config_does_not_leak_into_the_continuations(setup):
    """A repetition penalty, a min_p, suppressed and banned tokens in the model's generation_config
    (Qwen2.5-Instruct ships repetition_penalty 1.05) change nothing: the same seed gives the same
    values as on a model without them, and the model's config is left as it was."""
    model, tok, prompt, completion, _, _ = setup
    reward = lambda i, ids: float(sum(ids) % 2)          # noqa: E731 - depends on the whole continuation
    settings = ProbeSettings(k=16, positions="all", temperature=TEMPERATURE, max_new_tokens=8, seed=5)
    inputs = [ProbeInput(0, prompt, completion)]
    clean = probe(model, inputs, reward, settings, eos_id=tok.eos_token_id)
    config = model.generation_config
    saved = {k: getattr(config, k) for k in ("repetition_penalty", "min_p", "suppress_tokens", "bad_words_ids")}
    config.repetition_penalty, config.min_p = 5.0, 0.3
    config.suppress_tokens, config.bad_words_ids = [completion[0]], [[completion[2]]]
    try:
        polluted = probe(model, inputs, reward, settings, eos_id=tok.eos_token_id)
        assert model.generation_config is config and config.repetition_penalty == 5.0
    finally:
        for k, v in saved.items():
            setattr(config, k, v)
    assert polluted == clean
