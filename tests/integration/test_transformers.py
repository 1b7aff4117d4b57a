"""Hugging Face transformers on phantom, against the CPU.

A tiny GPT-2 and a tiny BERT, built from configs (nothing is downloaded),
train for two AdamW steps on both devices: losses, gradients and parameters
must be the CPU's bit for bit, and greedy generation must pick the CPU's
tokens. Dropout is on (training mode), so each step reseeds both
generators: phantom draws the CPU's random numbers.

GPT-2 runs with both attention implementations. Under "sdpa" the CPU's
scaled_dot_product_attention takes its fused flash kernel and phantom its
math decomposition (torch dispatches the choice per device type), so sums
are ordered differently and the results agree to float32 rounding, not bit
for bit; "eager" attention is the same ops on both and matches exactly.
"""
import copy

import pytest
import torch
from transformers import (AutoModelForCausalLM, BertConfig, BertForMaskedLM,
                          GPT2Config, GPT2LMHeadModel)

from conftest import assert_same_tensors

VOCAB = 64


def _gpt2(attn_implementation="eager"):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0,
                        attn_implementation=attn_implementation)
    return GPT2LMHeadModel(config)


def _bert():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=32)
    return BertForMaskedLM(config)


def _tokens(*shape, seed=1):
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def _padding_mask():
    """Two sequences of 8, the second with its last two tokens padded."""
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    return mask


def _train_twice(model, batch):
    """Two AdamW steps of ``model`` on ``batch`` (a dict of its inputs, on
    the model's device); returns per step (loss, gradients) and the final
    parameters. A parameter the loss does not reach has no gradient (None)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    steps = []
    for step in range(2):
        torch.manual_seed(100 + step)  # the dropout masks of this step
        loss = model(**batch).loss
        loss.backward()
        steps.append((loss.detach(), [p.grad.clone() for p in model.parameters()
                                      if p.grad is not None]))
        optimizer.step()
        optimizer.zero_grad()
    return steps, [p.detach() for p in model.parameters()]


def _to(batch, device):
    return {k: v.to(device) for k, v in batch.items()}


def _compare_training(make, batch, exact):
    cpu = make()
    phantom = copy.deepcopy(cpu).to("phantom")
    cpu_steps, cpu_params = _train_twice(cpu, batch)
    phantom_steps, phantom_params = _train_twice(phantom, _to(batch, "phantom"))
    for step, ((cpu_loss, cpu_grads), (loss, grads)) in enumerate(zip(cpu_steps, phantom_steps)):
        if exact:
            assert_same_tensors([loss], [cpu_loss], f"step {step} loss")
            assert_same_tensors(grads, cpu_grads, f"step {step} gradients")
        else:
            torch.testing.assert_close(loss.cpu(), cpu_loss)
            for g, c in zip(grads, cpu_grads):
                torch.testing.assert_close(g.cpu(), c)
    if exact:
        assert_same_tensors(phantom_params, cpu_params, "parameters after two AdamW steps")
    else:
        for p, c in zip(phantom_params, cpu_params):
            torch.testing.assert_close(p.cpu(), c)
    return phantom


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_gpt2_trains_like_the_cpu(attn_implementation):
    ids = _tokens(2, 8)
    batch = {"input_ids": ids, "attention_mask": _padding_mask(), "labels": ids}
    phantom = _compare_training(lambda: _gpt2(attn_implementation), batch,
                                exact=attn_implementation == "eager")
    # The output embedding stays the input embedding's Parameter on phantom.
    assert phantom.lm_head.weight is phantom.transformer.wte.weight


def test_bert_masked_lm_trains_like_the_cpu():
    ids = _tokens(2, 8, seed=2)
    labels = torch.full_like(ids, -100)
    labels[:, [1, 4]] = ids[:, [1, 4]]  # two masked positions per sequence
    batch = {"input_ids": ids, "attention_mask": _padding_mask(), "labels": labels}
    phantom = _compare_training(_bert, batch, exact=True)
    assert phantom.cls.predictions.decoder.weight is phantom.bert.embeddings.word_embeddings.weight


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_gpt2_greedy_generate_picks_the_cpus_tokens(attn_implementation):
    cpu = _gpt2(attn_implementation).eval()
    phantom = copy.deepcopy(cpu).to("phantom")
    prompt = _tokens(2, 4, seed=3)
    mask = torch.ones(2, 4, dtype=torch.long)
    mask[1, :1] = 0  # left padding
    expected = cpu.generate(prompt, attention_mask=mask, max_new_tokens=10, do_sample=False)
    got = phantom.generate(prompt.to("phantom"), attention_mask=mask.to("phantom"),
                           max_new_tokens=10, do_sample=False)
    assert got.device.type == "phantom"
    assert torch.equal(got.cpu(), expected)


def test_from_pretrained_with_device_map_loads_onto_phantom(tmp_path):
    saved = _gpt2().eval()
    saved.save_pretrained(tmp_path)
    ids = _tokens(2, 8, seed=4)
    expected = saved(ids).logits
    for device_map, device in (("phantom", "phantom:0"), ({"": "phantom:1"}, "phantom:1")):
        model = AutoModelForCausalLM.from_pretrained(tmp_path, device_map=device_map)
        assert {p.device for p in model.parameters()} == {torch.device(device)}, device_map
        assert model.lm_head.weight is model.transformer.wte.weight
        assert_same_tensors([model(ids.to(device)).logits.detach()], [expected.detach()],
                            f"logits of the model loaded with device_map={device_map!r}")
