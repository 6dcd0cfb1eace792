"""Models from libraries nobody here wrote, against our passes: the model zoo.

Each library is installed on demand, pinned, into its own folder (`.zoo/<library>`,
git-ignored) with `pip install --target`, and appended to `sys.path` after this
environment's packages, so that the JAX installed here (the one under test) is the one
that runs. Per model:

* every fixed whole-model policy: our residuals (count and bytes) beside what
  `jax.checkpoint(loss, policy)` saves in the installed JAX, the largest gradient error
  against `jax.grad` of the model as the library wrote it, XLA's footprint of the joint
  program (ours as `rp.jit` builds it on this backend, tied on CPU; JAX's `jax.jit` of
  `jax.vjp` of `jax.checkpoint(loss, policy)`), and the pass time (`rp.remat`);
* `auto` at the budget of `dots_saveable`'s activations: within it, exact gradients;
* the library's own remat setting (RecurrentGemma's `gradient_checkpointing=True`,
  Flax's `nn.remat`, Haiku's `hk.remat` and MaxText's `remat_policy` presets, all wrapping
  blocks in `jax.checkpoint`): JAX's residuals beside ours with the model's checkpoints applied by
  JAX at export (`jax_checkpoint="jax"`) and made regions our passes apply
  (`jax_checkpoint="regions"`); for MaxText also our spelling of the preset,
  `maxtext(preset)`, as the policy of the model without its checkpoints.

The Flax rows run in the test suite too (flax is a test dependency), so in CI; the other
libraries (TensorFlow through `gemma`, MaxText's stack) are gigabytes and stay here.

Every fixed policy runs in both forms, joint and split, and each row also has the largest
difference from the module with no policy (`rp.remat(module)`): in bf16 that is the "to the
last bit" check, set beside JAX's own difference between `jax.grad` of
`jax.checkpoint(loss, policy)` and of `loss` (XLA rounds a recomputed bf16 value in its own
fusion, so where JAX's recomputation differs, ours may too). `remat-opt` on the same module
(`--remat='policy=...' --print-saved-residuals`) must report the residuals the Python API
reports.

Libraries today: RecurrentGemma (`recurrentgemma[jax]==1.0.1`, a tiny Griffin with a native
`lax.scan` recurrence) and Gemma 3 (`gemma==3.3.0`, a two-layer `gm.nn` transformer with
local sliding and global attention, f32 and bf16; installed `--no-deps` with the pins below,
as `gemma` pulls TensorFlow through `kauldron`, and built from its modules, since its model
classes import a checkpoint loader that needs a kauldron for an older jax), and keras-hub
(`keras-hub==0.32.0` with keras 3.15, `GPT2Backbone` and `LlamaBackbone` on the JAX backend,
through `stateless_call`), and Flax (`flax==0.12.8` linen blocks, plain and under
`nn.remat`), and Haiku (`dm-haiku==0.0.17`: a 4-layer transformer in `hk.layer_stack`, its
layers plain and under `hk.remat`, with one step to an iteration, two, and unrolled whole),
and MaxText (`maxtext==0.2.5`, Python 3.12 only: a tiny llama2 decoder, its
presets `full`, `minimal`, `save_qkv_proj` and `save_dot_except_mlp` beside our
`maxtext(preset)` spelling on the same model with its layers' `jax.checkpoint` left out;
and, as MaxText runs by default, its layers by `lax.scan`: three llama2 layers, and three
Qwen3 mixture-of-experts layers; on an older Python it is skipped with a line saying so).
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tools.benchmarks import common

ZOO = Path(__file__).resolve().parents[2] / ".zoo"
LIBRARIES = {"recurrentgemma": ["recurrentgemma[jax]==1.0.1"],
             # gemma's own requirements pull TensorFlow and a kauldron that does not import
             # on this jax: installed without them, with what its modules import, pinned
             "gemma": ["--no-deps", "gemma==3.3.0", "kauldron==1.4.2", "flax==0.12.8",
                       "etils==1.15.0", "einops==0.8.2", "treescope==0.1.10",
                       "sentencepiece==0.2.3", "orbax-checkpoint==0.12.8", "msgpack==1.2.4",
                       "typing_extensions==4.16.0", "pyyaml==6.0.4", "clu==0.0.12",
                       "tensorflow==2.21.0", "protobuf==7.36.2", "wrapt==2.5.2", "six==1.17.0",
                       "gast==0.7.0", "astunparse==1.6.3", "termcolor==3.3.0",
                       "requests==2.34.2", "urllib3==2.8.0", "idna==3.20",
                       "certifi==2026.10.19.post1", "lark==1.3.1", "typeguard==4.6.1",
                       "immutabledict==4.3.1", "chex==0.1.92", "toolz==1.2.0",
                       "tqdm==4.70.1", "humanize==4.17.0", "tensorstore==0.1.86",
                       "simplejson==4.3.0", "ml_collections==1.1.0",
                       # (kauldron's typing imports jaxtyping: found before only where
                       # equinox, a benchmark dependency, had brought it)
                       "jaxtyping==0.3.11", "wadler_lindig==0.1.8"],
             "flax": ["--no-deps", "flax==0.12.8", "msgpack==1.2.4", "treescope==0.1.10",
                      "typing_extensions==4.16.0", "pyyaml==6.0.4"],
             # MaxText (Python 3.12) lists its requirements only under extras (cuda12, tpu), a
             # whole training stack; installed without them, with what the decoder's modules
             # import, pinned
             "maxtext": ["--no-deps",
                        "maxtext==0.2.5", "annotated_doc==0.0.7", "annotated_types==0.8.0",
                        "anyio==4.16.0", "aqtp==0.9.0", "array_record==0.8.6",
                        "certifi==2026.10.19.post1", "click==8.5.1", "cloudpickle==3.1.3",
                        "drjax==0.2.1", "einshape==1.0", "etils==1.15.0", "fastapi==0.165.0",
                        "filelock==4.3.1", "fire==0.7.1", "flax==0.12.12", "grain==0.2.18",
                        "h11==0.16.0", "httpcore2==2.16.2", "httpx2==2.16.2",
                        "huggingface_hub==2.4.0", "humanize==4.17.0", "idna==3.20",
                        "immutabledict==4.3.1", "jaxtyping==0.3.11", "jinja2==3.1.6",
                        "markupsafe==3.0.4", "mpmath==1.4.1", "msgpack==1.2.4",
                        "omegaconf==2.4.0", "opentelemetry_api==1.45.2",
                        "orbax_checkpoint==0.12.8", "pathwaysutils==0.1.13",
                        "portpicker==1.6.0", "protobuf==7.36.2", "psutil==7.2.2",
                        "pydantic==2.14.4", "pydantic_core==2.50.5", "pyyaml==6.0.4",
                        "qwix==0.1.8", "regex==2026.11.19", "requests==2.34.2",
                        "safetensors==0.8.0", "sentencepiece==0.2.3", "simplejson==4.3.0",
                        "six==1.17.0", "starlette==1.10.0", "sympy==1.14.0",
                        "tensorstore==0.1.86", "termcolor==3.3.0", "tiktoken==0.14.0",
                        "tokamax==0.0.17", "tokenizers==0.23.3", "tqdm==4.70.1",
                        "transformers==5.24.0", "treescope==0.1.10", "truststore==0.10.5",
                        "typing_extensions==4.16.0", "typing_inspection==0.4.5",
                        "urllib3==2.8.0", "uvicorn==0.54.0", "wadler_lindig==0.1.8",
                        "xprof==2.24.2"],
             # Haiku's own requirements are jmp and tabulate (numpy and jax are ours)
             "haiku": ["--no-deps", "dm-haiku==0.0.17", "jmp==0.0.4", "tabulate==0.10.0"],
             # keras-hub's requirements pull tensorflow-text and kagglehub, which these
             # backbones do not use
             "keras-hub": ["--no-deps", "keras-hub==0.32.0", "keras==3.15.0", "namex==0.1.0",
                           "optree==0.20.0", "h5py==3.16.0", "regex==2026.11.19",
                           "tokenizers==0.23.3"]}
POLICIES = ("everything_saveable", "nothing_saveable", "dots_saveable",
            "dots_with_no_batch_dims_saveable")
GRAD_TOL = 1e-5           # max |ours - jax.grad| / max |jax.grad|


def install(library: str, log=print) -> Path:
    """The folder `library` is installed in (installed now if it is not yet), now the one
    zoo folder on `sys.path`."""
    target = ZOO / library
    if not (target / ".installed").exists():
        log(f"zoo: installing {' '.join(LIBRARIES[library])} into {target}")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target),
                        *LIBRARIES[library]], check=True)
        (target / ".installed").write_text(" ".join(LIBRARIES[library]) + "\n")
    # one library's folder on the path at a time: their pins differ (RecurrentGemma's
    # typeguard is not the one kauldron needs), so the other folders and what was imported
    # from them go
    for other in ZOO.iterdir():
        if other != target and str(other) in sys.path:
            sys.path.remove(str(other))
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None) or ""
        if where.startswith(str(ZOO)) and not where.startswith(str(target)):
            del sys.modules[name]
    if str(target) not in sys.path:
        sys.path.append(str(target))      # after ours: the JAX under test stays first
    return target


def recurrentgemma_model(gradient_checkpointing: bool = False):
    """(loss, params, description): a tiny Griffin (recurrent, local attention, recurrent
    blocks), next-token loss on fixed random tokens."""
    from recurrentgemma import common as rg_common
    from recurrentgemma import jax as rg
    batch, seq, vocab = 2, 16, 128
    blocks = (rg_common.TemporalBlockType.RECURRENT, rg_common.TemporalBlockType.ATTENTION,
              rg_common.TemporalBlockType.RECURRENT)
    config = rg.GriffinConfig(vocab_size=vocab, width=64, mlp_expanded_width=128, num_heads=2,
                              block_types=blocks, embeddings_scale_by_sqrt_dim=True,
                              attention_window_size=8, logits_soft_cap=30.0,
                              scan_type=rg_common.ScanType.LINEAR_NATIVE)
    tokens = jax.random.randint(jax.random.key(0), (batch, seq), 0, vocab)
    positions = jnp.broadcast_to(jnp.arange(seq), (batch, seq))
    model = rg.Griffin(config, gradient_checkpointing=gradient_checkpointing)
    params = model.init(jax.random.key(1), tokens, positions)

    def loss(params):
        logits, _ = model.apply(params, tokens, positions)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[..., None], -1))
    return loss, params, ("Griffin, 3 blocks (recurrent, local attention, recurrent), width 64, "
                          f"batch {batch}, {seq} tokens, f32")


def gemma3_model(dtype: str = "float32"):
    """(loss, params, description): a tiny Gemma 3 (`gm.nn` Transformer: two layers, local
    sliding then global attention, QK norm, post-attention and post-MLP norms, GQA with one
    KV head), next-token loss on fixed random tokens, parameters and activations in
    `dtype`."""
    from gemma.gm.nn import _config, _modules, _transformer
    batch, seq, vocab = 2, 16, 256
    config = _config.TransformerConfig(
        final_logit_softcap=None, num_embed=vocab, embed_dim=64, hidden_dim=128, num_heads=4,
        head_dim=16, num_kv_heads=1, use_post_attn_norm=True, use_post_ffw_norm=True,
        use_qk_norm=True, attention_types=(_modules.AttentionType.LOCAL_SLIDING,
                                           _modules.AttentionType.GLOBAL),
        query_pre_attn_norm=_config.QueryPreAttentionNormalisation.BY_ONE_OVER_SQRT_HEAD_DIM,
        attn_logits_soft_cap=None, sliding_window_size=8, transpose_gating_einsum=True,
        local_base_frequency=10_000, global_base_frequency=1_000_000, vision_encoder=None)
    model = _transformer.Transformer(config=config, dtype=getattr(jnp, dtype))
    tokens = jax.random.randint(jax.random.key(0), (batch, seq), 0, vocab)
    params = model.init(jax.random.key(1), tokens)["params"]

    def loss(params):
        logits = model.apply({"params": params}, tokens).logits
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(logp, tokens[..., None], -1))
    return loss, params, (f"Gemma 3, 2 layers (local sliding, global attention), embed 64, "
                          f"4 heads of 16, 1 KV head, MLP 128, batch {batch}, {seq} tokens, "
                          f"{dtype}")


def keras_hub_model(kind: str = "gpt2"):
    """(loss, params, description): a tiny keras-hub backbone (`GPT2Backbone` or
    `LlamaBackbone`, KERAS_BACKEND=jax) through `stateless_call` with its trainable
    variables as the parameters; mean squared error of its final hidden states against
    fixed random targets."""
    import os
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras_hub
    batch, seq, vocab, hidden = 2, 16, 128, 32
    if kind == "gpt2":
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=vocab, num_layers=2, num_heads=2, hidden_dim=hidden,
            intermediate_dim=64, max_sequence_length=seq)
        what = "GPT2Backbone, 2 layers, 2 heads"
    else:
        backbone = keras_hub.models.LlamaBackbone(
            vocabulary_size=vocab, num_layers=2, num_query_heads=4, num_key_value_heads=2,
            hidden_dim=hidden, intermediate_dim=64)
        what = "LlamaBackbone, 2 layers, 4 query and 2 KV heads"
    tokens = jax.random.randint(jax.random.key(0), (batch, seq), 0, vocab)
    inputs = {"token_ids": tokens, "padding_mask": jnp.ones((batch, seq), jnp.int32)}
    target = jax.random.normal(jax.random.key(1), (batch, seq, hidden))
    params = [v.value for v in backbone.trainable_variables]
    fixed = [v.value for v in backbone.non_trainable_variables]

    def loss(params):
        out, _ = backbone.stateless_call(params, fixed, inputs)
        return jnp.mean((out - target) ** 2)
    return loss, params, (f"keras-hub {what}, hidden {hidden}, MLP 64, batch {batch}, "
                          f"{seq} tokens, f32, MSE of the hidden states")


def haiku_model(remat: str | None = None, unroll: int = 1):
    """(loss, params, description): a 4-layer pre-norm transformer in Haiku (`hk.Embed`,
    `hk.MultiHeadAttention` with a causal mask, an MLP), its layers run by
    `hk.layer_stack` (a `lax.scan` over the stacked parameters, `unroll` steps to an
    iteration), next-token loss on fixed random tokens. `remat`: each layer under
    `hk.remat` (its `jax.checkpoint`) with that policy ("default": none given, nothing
    saveable), else none."""
    import haiku as hk
    from jax.ad_checkpoint import checkpoint_name
    width, heads, mlp, seq, batch, layers, vocab = 64, 4, 128, 32, 4, 4, 128

    def block(x):
        h = hk.LayerNorm(-1, True, True)(x)
        a = hk.MultiHeadAttention(heads, width // heads,
                                  w_init=hk.initializers.VarianceScaling(1.0))(
            h, h, h, mask=jnp.tril(jnp.ones((1, 1, seq, seq), bool)))
        x = x + checkpoint_name(a, "attn_out")
        h = hk.LayerNorm(-1, True, True)(x)
        return x + hk.Linear(width)(jax.nn.gelu(hk.Linear(mlp)(h)))

    def forward(tokens):
        layer = block
        if remat is not None:
            layer = hk.remat(block, policy=None if remat == "default"
                             else getattr(jax.checkpoint_policies, remat))
        x = hk.layer_stack(layers, unroll=unroll)(layer)(hk.Embed(vocab, width)(tokens))
        return hk.Linear(vocab)(hk.LayerNorm(-1, True, True)(x))
    model = hk.without_apply_rng(hk.transform(forward))
    tokens = jax.random.randint(jax.random.key(1), (batch, seq), 0, vocab)
    params = model.init(jax.random.key(0), tokens)

    def loss(params):
        logp = jax.nn.log_softmax(model.apply(params, tokens).astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(logp, jnp.roll(tokens, 1, 1)[..., None], -1))
    return loss, params, (f"a transformer of {layers} layers in `hk.layer_stack` (a "
                          f"`lax.scan`), embed {width}, {heads} heads of {width // heads}, "
                          f"MLP {mlp}, vocabulary {vocab}, batch {batch}, {seq} tokens, f32")


def flax_model(remat: bool = False):
    """(loss, params, description): three Flax linen residual MLP blocks (LayerNorm, Dense
    128, GELU, Dense 64), each `nn.remat(Block)` with `remat`; mean squared error against
    fixed random targets."""
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.gelu(nn.Dense(128)(nn.LayerNorm()(x)))
            return x + nn.Dense(64)(h)

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            block = nn.remat(Block) if remat else Block
            for _ in range(3):
                x = block()(x)
            return x
    model = Model()
    x = jax.random.normal(jax.random.key(0), (8, 16, 64))
    y = jax.random.normal(jax.random.key(1), (8, 16, 64))
    params = model.init(jax.random.key(2), x)

    def loss(params):
        return jnp.mean((model.apply(params, x) - y) ** 2)
    return loss, params, ("Flax linen, 3 residual blocks (LayerNorm, Dense 128, GELU, Dense "
                          "64), batch 8 x 16 x 64, f32, MSE")


def maxtext_model(remat_policy: str | None = None, *, model_name: str = "llama2-7b",
                  scan_layers: bool = False, layers: int = 2, layer_policy: str | None = None,
                  **overrides):
    """(loss, params, description): a tiny MaxText decoder (`transformer_as_linen` from a
    `pyconfig` of `model_name`, by default `llama2-7b`, shrunk: `layers` layers, embed 64,
    4 heads of 16, MLP 128, vocabulary 256, `overrides` on top; its layers run one by one,
    or by `lax.scan` with `scan_layers`, MaxText's own default), next-token loss on fixed
    random tokens. MaxText wraps every decoder layer (the scanned layer function) in
    `jax.checkpoint` with the policy of its `remat_policy` preset (`none` included: its
    policy None is JAX's default, nothing saveable); with `remat_policy=None` the harness
    calls each layer without it (`jax.checkpoint` and `NNXDecoder._apply_layer_with_remat`
    replaced while the model is traced: the llama2 path calls `jax.checkpoint` itself), so
    that, as for the other libraries, the policies under test apply to the whole model;
    with `layer_policy` (a `jax.checkpoint_policies` name) it keeps MaxText's checkpoints
    with that policy instead of the preset's (JAX's side of a policy on a scanned model:
    `lax.scan(jax.checkpoint(layer, policy))`, as the models benchmark's scans)."""
    import os
    from maxtext.configs import pyconfig
    from maxtext.layers import nnx_decoders
    from maxtext.models import models as mt_models
    from maxtext.utils import maxtext_utils
    batch, seq, vocab = 2, 16, 256
    settings = dict(
        model_name=model_name, override_model_config=True, base_emb_dim=64,
        base_num_query_heads=4, base_num_kv_heads=4, base_mlp_dim=128,
        base_num_decoder_layers=layers, head_dim=16, vocab_size=vocab, max_target_length=seq,
        per_device_batch_size=batch, attention="dot_product", enable_checkpointing=False,
        remat_policy=remat_policy or "full", scan_layers=scan_layers, dtype="float32",
        weight_dtype="float32", run_name="zoo", skip_jax_distributed_system=True,
        enable_dropout=False)
    cfg = pyconfig.initialize(
        [None, os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")],
        **{**settings, **overrides})
    model = mt_models.transformer_as_linen(cfg, maxtext_utils.get_mesh_from_config(cfg),
                                           quant=None)
    tokens = jax.random.randint(jax.random.key(0), (batch, seq), 0, vocab)
    positions = jnp.broadcast_to(jnp.arange(seq), (batch, seq))
    segments = jnp.ones((batch, seq), jnp.int32)
    params = model.init({"params": jax.random.key(1), "dropout": jax.random.key(2)}, tokens,
                        positions, decoder_segment_ids=segments,
                        enable_dropout=False)["params"]
    with_remat = nnx_decoders.NNXDecoder._apply_layer_with_remat

    def plain(self, layer, y, policy, prevent_cse, **kwargs):   # the layer, no checkpoint
        return layer(y, **kwargs)

    def loss(params):
        checkpoint = jax.checkpoint
        if layer_policy is not None:
            forced = getattr(jax.checkpoint_policies, layer_policy)
            jax.checkpoint = lambda fun, policy=None, **kwargs: checkpoint(
                fun, policy=forced, **kwargs)
        elif remat_policy is None:
            nnx_decoders.NNXDecoder._apply_layer_with_remat = plain
            jax.checkpoint = lambda fun, **kwargs: fun
        try:
            logits = model.apply({"params": params}, tokens, positions,
                                 decoder_segment_ids=segments, enable_dropout=False)
        finally:
            nnx_decoders.NNXDecoder._apply_layer_with_remat = with_remat
            jax.checkpoint = checkpoint
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(logp, tokens[..., None], -1))
    what = (f"its layers in `jax.checkpoint` with `{layer_policy}`" if layer_policy else
            f"its layers in `jax.checkpoint` (`remat_policy={remat_policy}`)" if remat_policy
            else "its layers called without `jax.checkpoint`")
    extra = "".join(f", {k}={v}" for k, v in overrides.items())
    return loss, params, (f"MaxText {model_name} decoder, {layers} layers"
                          + (" run by `lax.scan` (`scan_layers=True`)" if scan_layers else "")
                          + f", embed 64, 4 heads of 16, MLP 128{extra}, vocabulary 256, "
                          f"batch {batch}, {seq} tokens, f32, {what}")


MODELS = {"recurrentgemma": ("recurrentgemma", recurrentgemma_model),
          "flax": ("flax", flax_model),
          "keras-gpt2": ("keras-hub", lambda: keras_hub_model("gpt2")),
          "keras-llama": ("keras-hub", lambda: keras_hub_model("llama")),
          "haiku": ("haiku", haiku_model),
          "gemma3": ("gemma", lambda: gemma3_model("float32")),
          "gemma3-bf16": ("gemma", lambda: gemma3_model("bfloat16")),
          "maxtext-llama2": ("maxtext", maxtext_model),
          "maxtext-llama2-scan": ("maxtext", lambda: maxtext_model(**MAXTEXT_SCAN)),
          "maxtext-qwen3-moe-scan": ("maxtext", lambda: maxtext_model(**MAXTEXT_MOE))}
# MaxText as it runs by default, its layers by `lax.scan`: three llama2 layers, and three
# Qwen3 mixture-of-experts layers (4 experts, 2 per token, dense einsums: the ragged kernels
# are TPU/GPU Pallas)
MAXTEXT_SCAN = {"scan_layers": True, "layers": 3}
MAXTEXT_MOE = {**MAXTEXT_SCAN, "model_name": "qwen3-30b-a3b", "num_experts": 4,
               "num_experts_per_tok": 2, "base_moe_mlp_dim": 128, "sparse_matmul": False,
               "megablox": False}
# models whose layers `lax.scan` runs, where our policy applies per iteration: JAX's side of a
# policy is then the library's own scan of `jax.checkpoint(layer, policy)` (as the models
# benchmark's scans; `jax.checkpoint(loss, policy)` around the whole loss would recompute the
# whole loop from its first carry), with the ops outside the loop as JAX runs them without a
# checkpoint, which keeps any of their values the backward reads: compared by activations
# (what is kept beyond the arguments), not by bytes with the arguments in
LAYER_REFERENCE = {"haiku": lambda policy: haiku_model(policy)[0],
                   "maxtext-llama2-scan": lambda policy: maxtext_model(
                       layer_policy=policy, **MAXTEXT_SCAN)[0],
                   "maxtext-qwen3-moe-scan": lambda policy: maxtext_model(
                       layer_policy=policy, **MAXTEXT_MOE)[0]}
NEEDS_PYTHON = {"maxtext": (3, 12)}
# the library's own remat settings: (make the model with it, the setting's text, our
# spelling of the same policy for the model without it, or None)
MAXTEXT_OWN = ("full", "minimal", "save_qkv_proj", "save_dot_except_mlp")
OWN_REMAT = {"recurrentgemma": [(lambda: recurrentgemma_model(gradient_checkpointing=True),
                                 "gradient_checkpointing=True", None)],
             "flax": [(lambda: flax_model(remat=True), "nn.remat(Block)", None)],
             # hk.remat in the layer stack, one step to an iteration, two, and unrolled whole
             # (the steps of an unrolled iteration each their own region: unrolled_scans)
             "haiku": [(lambda u=u: haiku_model("default", unroll=u),
                        f"hk.remat(block) in hk.layer_stack(unroll={u})", None)
                       for u in (1, 2, 4)],
             "maxtext-llama2": [(lambda p=p: maxtext_model(p), f"remat_policy={p}",
                                 f"maxtext({p})") for p in MAXTEXT_OWN],
             "maxtext-llama2-scan": [(lambda p=p: maxtext_model(p, **MAXTEXT_SCAN),
                                      f"remat_policy={p}", f"maxtext({p})")
                                     for p in MAXTEXT_OWN]}
FORMS = ("joint", "split")


def _jax_residuals(fun, *args) -> tuple[int, int, int]:
    """(count, bytes, activation bytes: those not of an argument) of what JAX saves."""
    from remat_passes.jax_compat import jax_saved_residuals
    saved = jax_saved_residuals(fun, *args)
    sizes = [(int(np.prod(a.shape)) * a.dtype.itemsize, "from the argument" in source)
             for a, source in saved]
    return (len(sizes), sum(n for n, _ in sizes),
            sum(n for n, argument in sizes if not argument))


def _ours(residuals) -> tuple[int, int]:
    return len(residuals), sum(r.bytes for r in residuals)


def _gradients(module, args, form: str = "joint") -> list:
    """The gradient leaves of an `export_vjp` module of a scalar loss (seed 1)."""
    if form == "joint":
        return jax.tree.leaves(module.call(*args, jnp.ones(())))[1:]
    fwd = jax.tree.leaves(module.call(*jax.tree.leaves(args), function="main_fwd"))
    return jax.tree.leaves(module.call(*fwd[1:], jnp.ones(()), function="main_bwd"))


def _difference(got, want) -> float:
    """The largest |got - want| over the largest |want| (in f32)."""
    want = [np.asarray(w, np.float32) for w in jax.tree.leaves(want)]
    scale = max(float(np.max(np.abs(w))) for w in want) or 1.0
    return max(float(np.max(np.abs(np.asarray(g, np.float32) - w)))
               for g, w in zip(jax.tree.leaves(got), want)) / scale


def _grad_error(module, args, reference, form: str = "joint") -> float:
    return _difference(_gradients(module, args, form), reference)


def _cli_residuals(module, policy: str, mode: str) -> tuple[int, int]:
    """(count, bytes) of the saved residuals `remat-opt` reports for the same module."""
    import re
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "module.mlir"
        module.save(str(path))
        done = subprocess.run(
            [sys.executable, "-m", "remat_passes.cli", str(path),
             f"--remat=policy={policy} mode={mode}", "--print-saved-residuals",
             "-o", str(Path(tmp) / "out.mlir")], capture_output=True, text=True, check=True)
    m = re.search(r"saved residuals of @main\w*: (\d+) values?, ([\d,]+) bytes",
                  done.stdout + done.stderr)
    return (int(m.group(1)), int(m.group(2).replace(",", ""))) if m else (-1, -1)


def _joint_footprints(exported, checkpointed, policy, args) -> tuple[int, int]:
    """XLA's footprint (temp + arguments + outputs) of our joint program as rp.jit builds it
    from `exported` on this backend (the xla benchmark's `our_joint`: each barrier variant
    rp.jit compiles, and where nothing is recomputed the residuals rounded too, the smallest)
    and of JAX's `jax.vjp` of the checkpointed loss (`checkpointed`). Both take every
    parameter: jax.jit would
    drop a parameter the loss never reads (keras-hub's Llama: the 16 KiB output embedding,
    as the loss reads the hidden states) from its arguments' count, although the array is in
    memory all the same (`keep_unused=True`)."""
    from tools.benchmarks.xla_memory import our_joint
    ct = jnp.ones(())
    ours = common.xla_footprint(our_joint(exported, policy, args, ct))
    theirs = jax.jit(lambda *a: jax.vjp(checkpointed, *a)[1](ct),
                     keep_unused=True).lower(*args).compile()
    return ours, common.xla_footprint(common.xla_memory(theirs))


def _split_halves(module, checkpointed, policy, args) -> tuple[list, list]:
    """XLA's temp bytes and footprints (temp + arguments + outputs) of each split half,
    [[ours, JAX's] forward, [ours, JAX's] backward] each: ours as rp.jit builds the split
    form on this backend (the xla benchmark's `our_split`), JAX's the forward and backward
    of `jax.vjp` of the checkpointed loss, jitted apart (`jax_halves`)."""
    from tools.benchmarks import xla_memory
    _, ours, _ = xla_memory.our_split(module, policy, args)
    theirs = xla_memory.jax_halves(checkpointed, args)
    return ([[a["temp"], b["temp"]] for a, b in zip(ours, theirs)],
            [[common.xla_footprint(a), common.xla_footprint(b)] for a, b in zip(ours, theirs)])


def measure(keys=tuple(MODELS), log=print, use_environment: bool = False,
            compiled: bool = True) -> dict:
    """The rows of `keys`. `use_environment`: the libraries as this environment has them,
    none installed into `.zoo` (the test suite runs the Flax rows so: flax is a test
    dependency). `compiled=False` leaves out what XLA's compiled programs give (the joint
    footprints, the split halves' temp bytes)."""
    import remat_passes as rp
    from remat_passes.api.variants import fences_chains, needs_tie
    from remat_passes.core.residuals import activation_bytes
    tie, fence = needs_tie(), fences_chains()
    rows, own, meta_models = [], [], {}
    for key in keys:
        library, make = MODELS[key]
        if sys.version_info < NEEDS_PYTHON.get(library, (0,)):
            log(f"zoo: {key} skipped: {library} needs Python "
                f"{'.'.join(map(str, NEEDS_PYTHON[library]))} (this is "
                f"{sys.version_info.major}.{sys.version_info.minor})")
            continue
        if not use_environment:
            install(library, log)
        loss, params, description = make()
        meta_models[key] = {"library": " ".join(p for p in LIBRARIES[library]
                                                if not p.startswith("-")),
                            "model": description}
        module = rp.export_vjp(loss, params)
        reference = jax.jit(jax.grad(loss))(params)
        unchanged = _gradients(rp.remat(module), (params,))      # the module, no policy
        budget = None
        for policy in POLICIES:
            checkpointed = (LAYER_REFERENCE[key](policy) if key in LAYER_REFERENCE else
                            jax.checkpoint(loss, policy=getattr(jax.checkpoint_policies,
                                                                policy)))
            jax_difference = _difference(jax.jit(jax.grad(checkpointed))(params), reference)
            jax_saves = _jax_residuals(checkpointed, params)
            for form in FORMS:
                t0 = time.perf_counter()
                out = rp.remat(module, policy, mode=form, tie_to_cotangent=tie,
                               fence_chains=fence)
                seconds = time.perf_counter() - t0
                got = _gradients(out, (params,), form)
                row = {"model": key, "policy": policy, "form": form,
                       "ours": _ours(out.residuals), "jax": jax_saves,
                       "cli": list(_cli_residuals(module, policy, form)),
                       "grad_error": _difference(got, reference),
                       "no_policy_difference": _difference(got, unchanged),
                       "jax_difference": jax_difference, "remat_s": seconds,
                       "activations": activation_bytes(out.residuals)}
                if key in LAYER_REFERENCE:
                    row["per_layer"] = True     # (JAX's side: the library's layers' scan)
                if compiled and form == "joint":
                    row["footprint"] = list(_joint_footprints(module, checkpointed, policy,
                                                              (params,)))
                elif compiled:
                    row["temp"], row["split_footprint"] = _split_halves(
                        module, checkpointed, policy, (params,))
                rows.append(row)
                if policy == "dots_saveable" and form == "joint":
                    budget = row["activations"]
                log(f"zoo: {key} {policy} {form}")
        out = rp.remat(module, rp.policies.auto(budget), tie_to_cotangent=tie,
                       fence_chains=fence)
        rows.append({"model": key, "policy": f"auto(budget={budget})", "budget": budget,
                     "ours": _ours(out.residuals), "activations": activation_bytes(out.residuals),
                     "grad_error": _grad_error(out, (params,), reference)})
        log(f"zoo: {key} auto")
        for make_own, setting, spelling in OWN_REMAT.get(key, []):
            gloss, gparams, _ = make_own()
            entry = {"model": key, "setting": setting,
                     "jax_saves": _jax_residuals(gloss, gparams)}
            for how in ("jax", "regions"):
                m = rp.remat(rp.export_vjp(gloss, gparams, jax_checkpoint=how))
                entry[f"export_{how}"] = _ours(m.residuals)
            if spelling:   # our spelling of the setting, on the model without it
                entry["spelling"] = spelling
                entry["ours_spelled"] = _ours(rp.remat(module, spelling).residuals)
            own.append(entry)
            log(f"zoo: {key} own remat {setting}")
    return {"meta": common.machine(), "models": meta_models, "tie_to_cotangent": tie,
            "rows": rows, "own": own}


def merge(old: dict | None, new: dict) -> dict:
    """`new`'s models, and `old`'s other models as they were measured (`--models` measures
    a subset); each model keeps the commit and jax it was measured with."""
    for m in new["models"].values():
        m.setdefault("commit", new["meta"]["commit"])
        m.setdefault("jax", new["meta"]["jax"])
    if not old:
        return new
    kept = {k: v for k, v in old["models"].items() if k not in new["models"]}
    for m in kept.values():
        m.setdefault("commit", old["meta"]["commit"])
        m.setdefault("jax", old["meta"]["jax"])
    own = {(e["model"], e["setting"]): e   # (one entry per setting: the latest)
           for e in [e for e in old["own"] if e["model"] in kept] + new["own"]}
    return dict(new, models={**kept, **new["models"]},
                rows=[r for r in old["rows"] if r["model"] in kept] + new["rows"],
                own=list(own.values()))


def checks(data) -> list[tuple[str, bool]]:
    """Gradients within GRAD_TOL of jax.grad; residual bytes at most JAX's (activations, on a
    model with a `LAYER_REFERENCE`); the joint footprint at most JAX's + 2%; auto within its
    budget; the library's own remat, made regions, keeps at most JAX's bytes."""
    out = []
    for r in data["rows"]:
        name = f"{r['model']} {r['policy']}" + (f" {r['form']}" if "form" in r else "")
        low = "bf16" in r["model"]      # (gradients in bf16: measured against the bits below)
        if not low:
            out.append((f"{name}: gradient error {r['grad_error']:.1e} (relative to the "
                        "largest)", r["grad_error"] <= GRAD_TOL))
        if "no_policy_difference" in r:
            d, j = r["no_policy_difference"], r["jax_difference"]
            # bf16: to the last bit where JAX's own checkpoint is exact, else no further off
            out.append((f"{name}: difference from the module with no policy {d:.1e}, "
                        f"JAX's checkpoint from jax.grad {j:.1e}",
                        d <= (j if low else max(j, GRAD_TOL))))
        if "cli" in r:
            out.append((f"{name}: remat-opt reports {r['cli'][0]} residuals, "
                        f"{r['cli'][1]:,} B; the Python API {r['ours'][0]}, {r['ours'][1]:,} B",
                        list(r["cli"]) == list(r["ours"])))
        if "jax" in r and r.get("per_layer"):
            out.append((f"{name}: activations {r['activations']:,} B vs JAX's "
                        f"{r['jax'][2]:,} B (its layers' scan of jax.checkpoint)",
                        r["activations"] <= r["jax"][2]))
        elif "jax" in r:
            out.append((f"{name}: residual bytes {r['ours'][1]:,} vs JAX's {r['jax'][1]:,}",
                        r["ours"][1] <= r["jax"][1]))
        if "footprint" in r:
            a, b = r["footprint"]
            out.append((f"{name}: joint footprint {a:,} B vs JAX's {b:,} B", a <= b * 1.02))
        fewer = (0 if "jax" not in r else r["jax"][2] - r["activations"] if r.get("per_layer")
                 else r["jax"][1] - r["ours"][1])
        footprints = r.get("split_footprint", [None, None])
        for half, (a, b), fp in zip(("forward", "backward"), r.get("temp", ()), footprints):
            if r.get("per_layer"):
                # (JAX keeps values of the ops outside its layers' checkpoint, copies of the
                # parameters among them, as residuals where ours makes them again as scratch:
                # what each half adds to the caller's arguments is its scratch and the
                # activations between the halves, the rest, its gradients, being the same)
                mine, theirs = a + r["activations"], b + r["jax"][2]
                out.append((f"{name}: {half} temp and activations {a:,} + {r['activations']:,}"
                            f" B vs JAX's {b:,} + {r['jax'][2]:,} B",
                            mine <= theirs * 1.02))
                continue
            # (a value JAX keeps can be scratch in ours: say so beside the temp figure, with
            # the half's footprint, where the residual is an argument of JAX's backward)
            why = f"ours keeps {fewer:,} B fewer residuals" if fewer > 0 and a > b else ""
            if why and fp:
                why += f"; the half's footprint {fp[0]:,} B vs JAX's {fp[1]:,} B"
            out.append((f"{name}: {half} temp {a:,} B vs JAX's {b:,} B"
                        + (f" ({why})" if why else ""), a <= b * 1.02))
        if "budget" in r:
            out.append((f"{name}: activations {r['activations']:,} B within the budget",
                        r["activations"] <= r["budget"]))
    for e in data["own"]:
        out.append((f"{e['model']} {e['setting']}, made regions: {e['export_regions'][1]:,} B "
                    f"vs JAX's {e['jax_saves'][1]:,} B",
                    e["export_regions"][1] <= e["jax_saves"][1]))
        if "spelling" in e:
            out.append((f"{e['model']} {e['setting']}, as the policy `{e['spelling']}` on the "
                        f"model without it: {e['ours_spelled'][1]:,} B vs JAX's "
                        f"{e['jax_saves'][1]:,} B", e["ours_spelled"][1] <= e["jax_saves"][1]))
    return out


def render(data) -> str:
    meta = data["meta"]
    parts = ["## Model zoo", "",
             "Models from libraries nobody here wrote, installed pinned into their own folder "
             "(`.zoo/`) by the benchmark itself, on the "
             f"{meta['backend']} backend ({meta['cpus']} CPUs, " + (
                 f"jax {meta['jax']}, commit {meta['commit']}" if len(
                     {(m.get("jax"), m.get("commit")) for m in data["models"].values()}) <= 1
                 else "jax and commit per model below: MaxText needs Python 3.12, so its "
                      "run is the jax of that environment") + "). Residuals are ours beside "
             "`jax.checkpoint(loss, policy)`'s in the installed JAX (count, bytes; for a model "
             "whose layers `lax.scan` runs, where our policy applies per iteration, beside the "
             "library's own scan of `jax.checkpoint(layer, policy)`, with the ops outside the "
             "loop as JAX runs them without a checkpoint: those keep any value the backward "
             "reads, a copy of an argument among them, so there the activations, what is kept "
             "beyond the arguments, are compared); the gradient error is the largest "
             "difference from `jax.grad` of the model as the library wrote it, over the "
             "largest gradient; the footprint is XLA's (temp + arguments + outputs - aliased) "
             "of the joint program: ours as `rp.jit` builds it here"
             + (" (tied to the cotangent on CPU)" if data.get("tie_to_cotangent") else "")
             + " (where nothing is recomputed, the smaller of it with the residuals rounded "
             "to their own type, as jax.checkpoint rounds them, and without)"
             + ", JAX's `jax.jit` of `jax.vjp` of the checkpointed loss, with every "
             "parameter kept (`keep_unused=True`: one the loss never reads is in memory all "
             "the same, and ours counts it); the split temp is "
             "XLA's scratch of each half of the split form, ours as `rp.jit` builds it "
             "(as in [Memory as XLA allocates it](#memory-as-xla-allocates-it)), JAX's the "
             "forward and backward of `jax.vjp` jitted apart (where measured). Regenerate with "
             "`python -m tools.benchmarks zoo`. The Flax rows also run in the test suite, and "
             "so in CI (`test_zoo.py::test_the_flax_rows_hold`, with the flax of the test "
             "environment; the other libraries are gigabytes).", ""]
    for key, m in data["models"].items():
        parts += [f"### {key}: {m['model']}", "", f"`{m['library']}`"
                  + (f" (measured at commit {m['commit']}, jax {m['jax']}"
                     + (f", XLA flags `{m['xla_flags']}`" if m.get("xla_flags") else
                        ", XLA's default flags (YNNPACK fusions on, whose buffers "
                        "memory_analysis() does not count)") + ")" if "commit" in m
                     else ""), "",
                  "| policy | form | residuals ours / JAX / remat-opt | bytes ours / JAX | "
                  "gradient error | from no policy / JAX's | joint footprint ours / JAX | "
                  "split temp ours / JAX | rp.remat |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in data["rows"]:
            if r["model"] != key:
                continue
            if "jax" in r:
                fp = ""
                if "footprint" in r:
                    a, b = r["footprint"]
                    fp = f"{a:,} / {b:,} ({a / b:.2f})"
                temp = "; ".join(f"{half} {a:,} / {b:,}" + (f" ({a / b:.2f})" if b else "")
                                 for half, (a, b) in zip(("fwd", "bwd"), r.get("temp", ())))
                cli = r.get("cli", ["", ""])
                parts.append(f"| `{r['policy']}` | {r.get('form', 'joint')} | {r['ours'][0]} / "
                             f"{r['jax'][0]} / {cli[0]} | {r['ours'][1]:,} / {r['jax'][1]:,}"
                             + (f" (activations {r['activations']:,} / {r['jax'][2]:,})"
                                if r.get("per_layer") else "") + " | "
                             f"{r['grad_error']:.1e} | "
                             + (f"{r['no_policy_difference']:.1e} / {r['jax_difference']:.1e}"
                                if "no_policy_difference" in r else "")
                             + f" | {fp} | {temp} | {r['remat_s']:.2f} s |")
            else:
                parts.append(f"| `{r['policy']}` (the activations of `dots_saveable`) | joint | "
                             f"{r['ours'][0]} | {r['ours'][1]:,} (activations "
                             f"{r['activations']:,}) | {r['grad_error']:.1e} | | | | |")
        for e in data["own"]:
            if e["model"] == key:
                j, x, g = e["jax_saves"], e["export_jax"], e["export_regions"]
                parts += ["", f"The library's own remat, `{e['setting']}` (its blocks in "
                          f"`jax.checkpoint`): JAX saves {j[0]} values ({j[1]:,} B). The "
                          f"passes keep {x[0]} ({x[1]:,} B) when JAX applies those checkpoints "
                          f"at export (`jax_checkpoint=\"jax\"`), and {g[0]} ({g[1]:,} B) when "
                          "they are regions the passes apply (`jax_checkpoint=\"regions\"`)"
                          + (f"; the policy `{e['spelling']}` on the model without them keeps "
                             f"{e['ours_spelled'][0]} ({e['ours_spelled'][1]:,} B)."
                             if "spelling" in e else ".")]
        parts.append("")
    results = checks(data)
    missed = [text for text, ok in results if not ok]
    parts += [f"Checks: {len(results) - len(missed)} of {len(results)} pass (f32 gradients "
              f"within {GRAD_TOL:g} of jax.grad; the difference from the module with no policy "
              "no larger than JAX's checkpoint's from jax.grad, in bf16 to the last bit where "
              "JAX's is exact; remat-opt's residuals the Python API's; residual bytes at most "
              "JAX's (activations, where the layers are scanned); the joint footprint and the "
              "temp of each split half at most JAX's + 2% (where the layers are scanned, its "
              "temp and the activations between the halves); auto within its budget). Missed:",
              ""]
    parts += [f"- {text}" for text in missed] or ["- none"]
    return "\n".join(parts) + "\n"
