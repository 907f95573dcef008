"""Real architectures through aot_eager, hpu_backend and hpu_backend strict, each compared with eager.

Tiny configurations of transformers' models (random weights, built from their config classes: no
download) and a few vision models written here, in three cells each: inference, one training step
(loss and every parameter's gradient), and ``dynamic=True`` at two sequence lengths (decoders).
A cell passes when the compiled run matches eager (``torch.testing.assert_close``); for hpu_backend
the JSON also records graphs that ran eagerly and CPU-fallback ops. Writes
``bench/results/real_models.json`` and prints the README's table.

    python bench/real_models.py [--models gpt2,llama] [--cells inference,training,dynamic]

tests/test_real_models.py runs a representative subset of these cells in strict mode.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch._dynamo

RESULTS = Path(__file__).resolve().parent / "results"
BACKENDS = {"aot_eager": ("aot_eager", None), "hpu_backend": ("hpu_backend", {"cache": False}),
            "hpu_backend strict": ("hpu_backend", {"cache": False, "strict": True})}
CELLS = ("inference", "training", "dynamic")
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # the same for every backend; traced graphs round differently
DROPOUTS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
            "activation_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout", "classifier_dropout",
            "dropout_rate", "drop_path_rate", "layerdrop", "encoder_layerdrop", "decoder_layerdrop",
            "feat_proj_dropout", "final_dropout", "mask_time_prob", "mask_feature_prob", "summary_first_dropout",
            "classifier_dropout_prob", "embed_dropout", "ffn_dropout", "residual_dropout", "output_dropout",
            "projection_dropout", "attention_probs_dropout", "resid_dropout", "emb_dropout", "proj_dropout")


@dataclass(frozen=True)
class Spec:
    """One architecture: how to build it (seeded) and its example inputs (``size``: the sequence length)."""

    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int], dict]
    dynamic: bool = False  # the dynamic cell runs (a decoder over two sequence lengths)
    sizes: tuple[int, int] = (8, 13)


def _hf(model_cls: str, config_cls: str, **config) -> Callable[..., torch.nn.Module]:
    def build(**overrides):  # overrides: config fields a caller changes (fewer layers for a quick run)
        import transformers

        cfg = getattr(transformers, config_cls)(**{**config, **overrides})
        for name in DROPOUTS:  # eager and compiled runs must draw no random numbers
            if isinstance(getattr(cfg, name, None), float):
                setattr(cfg, name, 0.0)
        torch.manual_seed(0)
        return getattr(transformers, model_cls)(cfg)
    return build


def _tokens(vocab: int = 96, batch: int = 2, **extra) -> Callable[[int], dict]:
    def make(size: int) -> dict:
        g = torch.Generator().manual_seed(size)
        out = {"input_ids": torch.randint(1, vocab, (batch, size), generator=g)}
        for k, v in extra.items():
            out[k] = v(size, g)
        return out
    return make


def _pixels(size: int = 32, channels: int = 3) -> Callable[[int], dict]:
    return lambda _: {"pixel_values": torch.randn(2, channels, size, size, generator=torch.Generator().manual_seed(1))}


DECODER = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=64)
LLAMA_LIKE = dict(DECODER, num_key_value_heads=2)


class MobileNetish(torch.nn.Module):
    """Depthwise-separable blocks with squeeze-excitation and hard-swish (MobileNetV3's pieces)."""

    def __init__(self, width: int = 16, classes: int = 10):
        super().__init__()
        torch.manual_seed(0)
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, width, 3, 2, 1), torch.nn.BatchNorm2d(width),
                                        torch.nn.Hardswish())
        self.dw = torch.nn.Sequential(torch.nn.Conv2d(width, width, 3, 1, 1, groups=width),
                                      torch.nn.BatchNorm2d(width), torch.nn.ReLU6())
        self.se = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Conv2d(width, 4, 1), torch.nn.ReLU(),
                                      torch.nn.Conv2d(4, width, 1), torch.nn.Hardsigmoid())
        self.pw = torch.nn.Sequential(torch.nn.Conv2d(width, 2 * width, 1), torch.nn.BatchNorm2d(2 * width))
        self.head = torch.nn.Linear(2 * width, classes)

    def forward(self, pixel_values):
        x = self.dw(self.stem(pixel_values))
        x = self.pw(x * self.se(x))
        return torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1).log_softmax(-1)


class MixerBlock(torch.nn.Module):
    """An MLP-Mixer: patches by a strided convolution, token and channel MLPs, layer norms."""

    def __init__(self, dim: int = 32, patches: int = 16, classes: int = 10):
        super().__init__()
        torch.manual_seed(0)
        self.patch = torch.nn.Conv2d(3, dim, 8, 8)
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.tokens = torch.nn.Sequential(torch.nn.Linear(patches, 32), torch.nn.GELU(), torch.nn.Linear(32, patches))
        self.channels = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.GELU(), torch.nn.Linear(64, dim))
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, pixel_values):
        x = self.patch(pixel_values).flatten(2).transpose(1, 2)
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        x = x + self.channels(self.norm2(x))
        return self.head(x.mean(1))


def _seq2seq(vocab: int = 96) -> Callable[[int], dict]:
    return _tokens(vocab, decoder_input_ids=lambda s, g: torch.randint(1, vocab, (2, max(s // 2, 2)), generator=g))


SPECS = [
    Spec("gpt2", _hf("GPT2LMHeadModel", "GPT2Config", vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64),
         _tokens(), dynamic=True),
    Spec("bert", _hf("BertForMaskedLM", "BertConfig", **DECODER),
         _tokens(attention_mask=lambda s, g: torch.ones(2, s, dtype=torch.long)),
         dynamic=True),
    Spec("llama", _hf("LlamaForCausalLM", "LlamaConfig", **LLAMA_LIKE), _tokens(), dynamic=True),
    Spec("mistral", _hf("MistralForCausalLM", "MistralConfig", **LLAMA_LIKE, sliding_window=8), _tokens()),
    Spec("qwen2", _hf("Qwen2ForCausalLM", "Qwen2Config", **LLAMA_LIKE), _tokens(), dynamic=True),
    Spec("gemma", _hf("GemmaForCausalLM", "GemmaConfig", **LLAMA_LIKE, head_dim=8), _tokens()),
    Spec("phi", _hf("PhiForCausalLM", "PhiConfig", **DECODER), _tokens()),
    Spec("falcon", _hf("FalconForCausalLM", "FalconConfig", vocab_size=96, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4), _tokens()),
    Spec("opt", _hf("OPTForCausalLM", "OPTConfig", vocab_size=96, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                    num_attention_heads=4, word_embed_proj_dim=32, max_position_embeddings=64), _tokens()),
    Spec("bloom", _hf("BloomForCausalLM", "BloomConfig", vocab_size=96, hidden_size=32, n_layer=2, n_head=4),
         _tokens()),
    Spec("gpt_neox", _hf("GPTNeoXForCausalLM", "GPTNeoXConfig", **DECODER), _tokens()),
    Spec("mixtral", _hf("MixtralForCausalLM", "MixtralConfig", **LLAMA_LIKE, num_local_experts=4,
                        num_experts_per_tok=2), _tokens()),
    Spec("t5", _hf("T5ForConditionalGeneration", "T5Config", vocab_size=96, d_model=32, d_kv=8, d_ff=64,
                   num_layers=1, num_decoder_layers=1, num_heads=4), _seq2seq()),
    Spec("bart", _hf("BartForConditionalGeneration", "BartConfig", vocab_size=96, d_model=32, encoder_layers=1,
                     decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                     decoder_ffn_dim=64, max_position_embeddings=64), _seq2seq()),
    Spec("whisper", _hf("WhisperForConditionalGeneration", "WhisperConfig", vocab_size=96, d_model=32,
                        encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=16,
                        max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        decoder_start_token_id=1),
         lambda s: {"input_features": torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1)),
                    "decoder_input_ids": torch.randint(1, 96, (2, s), generator=torch.Generator().manual_seed(s))}),
    Spec("clip", _hf("CLIPModel", "CLIPConfig",
                     text_config=dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, max_position_embeddings=32),
                     vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, image_size=32, patch_size=8), projection_dim=16),
         lambda s: {**_tokens()(s), **_pixels()(s)}),
    Spec("wav2vec2", _hf("Wav2Vec2Model", "Wav2Vec2Config", hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                         conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
         lambda s: {"input_values": torch.randn(2, 400, generator=torch.Generator().manual_seed(1))}),
    Spec("vit", _hf("ViTForImageClassification", "ViTConfig", image_size=32, patch_size=8, hidden_size=32,
                    num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, num_labels=10), _pixels()),
    Spec("convnext", _hf("ConvNextForImageClassification", "ConvNextConfig", num_stages=2, hidden_sizes=[8, 16],
                         depths=[1, 1], num_labels=10), _pixels()),
    Spec("resnet", _hf("ResNetForImageClassification", "ResNetConfig", embedding_size=8, hidden_sizes=[8, 16],
                       depths=[1, 1], num_labels=10), _pixels()),
    Spec("swin", _hf("SwinForImageClassification", "SwinConfig", image_size=32, patch_size=4, embed_dim=16,
                     depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=10), _pixels()),
    Spec("levit", _hf("LevitForImageClassification", "LevitConfig", image_size=64, hidden_sizes=[16, 32],
                      num_attention_heads=[2, 2], depths=[1, 1], key_dim=[8, 8],
                      down_ops=[["Subsample", 8, 2, 4, 2, 2]], num_labels=10), _pixels(64)),
    Spec("mobilenetish", MobileNetish, _pixels()),
    Spec("mixer", MixerBlock, _pixels()),
]
BY_NAME = {s.name: s for s in SPECS}


def main_output(out) -> torch.Tensor:
    """The first tensor of a model's output (logits, last hidden state, ...)."""
    if isinstance(out, torch.Tensor):
        return out
    values = out.to_tuple() if hasattr(out, "to_tuple") else out
    return next(v for v in values if isinstance(v, torch.Tensor))


def loss_of(out) -> torch.Tensor:
    return main_output(out).float().pow(2).mean()


@dataclass
class Outcome:
    ok: bool
    error: str = ""
    eager_graphs: int = 0  # graphs hpu_backend ran eagerly after a lowering failure
    fallbacks: dict = field(default_factory=dict)  # CPU-fallback op -> nodes, in the recipes taken up
    seconds: float = 0.0


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def compile_with(model, backend: str, dynamic: bool = False):
    name, options = BACKENDS[backend]
    return torch.compile(model, backend=name, options=options, dynamic=dynamic or None)


def run_inference(spec: Spec, backend: str) -> None:
    model = spec.build().eval()
    compiled = compile_with(model, backend)
    inputs = spec.inputs(spec.sizes[0])
    with torch.no_grad():
        torch.testing.assert_close(main_output(compiled(**inputs)), main_output(model(**inputs)), **TOLERANCE)


def run_training(spec: Spec, backend: str) -> None:
    model = spec.build().train()
    twin = copy.deepcopy(model)  # batch-norm statistics change in a step: each run gets its own copy
    inputs = spec.inputs(spec.sizes[0])
    loss = loss_of(compile_with(model, backend)(**inputs))
    loss.backward()
    ref = loss_of(twin(**inputs))
    ref.backward()
    torch.testing.assert_close(loss, ref, **TOLERANCE)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        if q.grad is not None or p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, **TOLERANCE, msg=lambda m: f"gradient of {name}: {m}")


def run_dynamic(spec: Spec, backend: str) -> None:
    model = spec.build().eval()
    compiled = compile_with(model, backend, dynamic=True)
    with torch.no_grad():
        for size in spec.sizes:
            inputs = spec.inputs(size)
            torch.testing.assert_close(main_output(compiled(**inputs)), main_output(model(**inputs)), **TOLERANCE)


RUNNERS = {"inference": run_inference, "training": run_training, "dynamic": run_dynamic}


def run_cell(spec: Spec, cell: str, backend: str) -> Outcome:
    """One cell, in a fresh Dynamo; the outcome says whether it matched eager and what fell back."""
    from hpu_backend.serve import fallback

    torch._dynamo.reset()
    handler, logger = _Warnings(), logging.getLogger("hpu_backend")
    logger.addHandler(handler)
    before = fallback.recipe_counts()
    start = time.perf_counter()
    try:
        RUNNERS[cell](spec, backend)
        outcome = Outcome(True)
    except Exception as e:  # a cell's failure is its result
        outcome = Outcome(False, _one_line(e))
        logging.getLogger(__name__).debug("%s", traceback.format_exc())
    finally:
        logger.removeHandler(handler)
    outcome.seconds = time.perf_counter() - start
    outcome.eager_graphs = sum("eagerly" in m for m in handler.messages)
    outcome.fallbacks = dict(fallback.recipe_counts() - before)
    return outcome


def _one_line(e: Exception) -> str:
    """The error's type and its first informative line (Dynamo's wrapper puts the cause on the second)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = " ".join(lines[:2]) if lines and lines[0].endswith("raised:") else (lines[0] if lines else "")
    return f"{type(e).__name__}: {text}"[:400]


def cells_of(spec: Spec, cells) -> list[str]:
    return [c for c in cells if c != "dynamic" or spec.dynamic]


def table(results: dict) -> str:
    """The README table: per cell and backend, passes out of the models run (and how many needed help)."""
    rows = ["| cell | aot_eager | hpu_backend | hpu_backend strict |", "|---|---|---|---|"]
    for cell in CELLS:
        found = [r for r in results.values() if cell in r]
        if not found:
            continue
        parts = []
        for backend in BACKENDS:
            outs = [r[cell][backend] for r in found if backend in r[cell]]
            text = f"{sum(o['ok'] for o in outs)}/{len(outs)}"
            eager = sum(o["ok"] and o["eager_graphs"] > 0 for o in outs)
            cpu = sum(o["ok"] and bool(o["fallbacks"]) for o in outs)
            notes = [f"{eager} with eager graphs"] * bool(eager) + [f"{cpu} with CPU fallbacks"] * bool(cpu)
            parts.append(text + (f" ({', '.join(notes)})" if notes else ""))
        rows.append(f"| {cell} | {' | '.join(parts)} |")
    return "\n".join(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(BY_NAME))
    parser.add_argument("--cells", default=",".join(CELLS))
    parser.add_argument("--out", default=str(RESULTS / "real_models.json"))
    parser.add_argument("--update", action="store_true", help="keep the other models' results in --out")
    parser.add_argument("--combine", nargs="+", metavar="JSON", help="merge the results of runs over other models "
                        "(run in parallel, each with its own --out) into --out, running nothing")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    logging.getLogger("hpu_backend").setLevel(logging.WARNING)
    out = Path(args.out)
    results: dict = json.loads(out.read_text())["results"] if args.update and out.exists() else {}
    for part in args.combine or ():
        results.update(json.loads(Path(part).read_text())["results"])
    for name in [] if args.combine else args.models.split(","):
        spec = BY_NAME[name]
        results[name] = {}
        for cell in cells_of(spec, args.cells.split(",")):
            results[name][cell] = {b: vars(run_cell(spec, cell, b)) for b in BACKENDS}
            brief = {b: ("ok" if o["ok"] else o["error"][:120]) for b, o in results[name][cell].items()}
            print(f"{name:14} {cell:10} {brief}", file=sys.stderr, flush=True)
    results = {name: results[name] for name in BY_NAME if name in results}  # the table's order
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"torch": torch.__version__, "results": results, "table": table(results)}, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
