"""The built-in trainer's configuration: one torch-free pydantic model.

The operator embeds `TrainerConfig` in the TrainingJob spec (`spec.trainer`), so the same model validates
a manifest at `kubectl apply` time (through the generated CRD schema) and at trainer start-up.
Every field documents its default and unit because its description becomes `kubectl explain` text.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Precision = Literal["auto", "fp32", "bf16"]
"""What `TrainerConfig.precision` accepts; `precision.compute_dtype` turns it into a torch dtype."""

TEST_TIME_VIEWS = ("run", "none", "flip", "translate", "flip+translate")
"""What `kubetrain evaluate --tta` and `predict --tta` accept (`evaluation.chosen_views`): `run` (their
default) the views the model's training run validated with (`eval_flip_tta`, `eval_translate_tta`), the
others a fixed choice whatever the run used."""


MODELS_WITH_NORMALIZED_FILTERS = ("whitened_cnn", "resnet_small", "resnet18")
"""Models whose every trainable convolution feeds batch norm, so the scale of its filters does not matter:
what the muon optimizer, which fixes that scale, needs."""


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a manifest must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid")


class DataConfig(_Strict):
    """Where the training data comes from and how it is split."""

    dataset: Literal["cifar10", "imagefolder", "fake"] = Field(
        "cifar10",
        description=(
            "dataset selects the data source. cifar10: an ImageFolder tree `<root>/train/<class>/*.jpg` "
            "when present, else torchvision CIFAR-10 under `root` (downloaded when the network allows); "
            "imagefolder: any ImageFolder directory `<root>/<class>/<image>`; fake: torchvision FakeData "
            "(random images) for smoke tests. Default cifar10."
        ),
    )
    root: str = Field(
        "/data",
        description="root is the directory holding the dataset (or where it is downloaded). Default /data.",
    )
    image_size: int = Field(
        32,
        ge=8,
        le=512,
        description="image_size is the side in pixels every image is resized to. Default 32.",
    )
    validation_fraction: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description=(
            "validation_fraction is the share of each class held out for evaluation, taken from the end of "
            "each class in file order so the split is the same on every rank and every run. Default 0.1."
        ),
    )
    fake_size: int = Field(
        512,
        ge=1,
        le=1_000_000,
        description="fake_size is the number of images FakeData generates (dataset fake only). Default 512.",
    )
    cache_decoded: bool = Field(
        True,
        description=(
            "cache_decoded stores the decoded uint8 tensors next to the data so later runs and restarts skip "
            "JPEG decoding. Default true."
        ),
    )
    cache: Literal["auto", "memory", "disk"] = Field(
        "auto",
        description=(
            "cache is where the decoded images are held while training. memory: in every process's memory "
            "(fastest; refused with exit 3 when the predicted peak exceeds the container's memory limit); "
            "disk: an ImageFolder tree is decoded once per node into one file of uint8 images (resized to "
            "image_size) that every process of the node memory-maps, so the node holds one copy in its page "
            "cache, which the kernel may drop and read back: sets larger than memory train without an "
            "out-of-memory kill; auto: memory when its predicted peak fits the limit, else disk. On a GPU "
            "the set is also copied onto the device only when it fits there, else batches are copied per "
            "step. Default auto."
        ),
    )
    cache_dir: str = Field(
        "",
        description=(
            "cache_dir is the directory of the decoded cache file, on a disk of the node (an emptyDir or "
            "hostPath volume) when the data volume is read-only; empty: `.kubetrain-cache/` beside the data "
            "tree. Default empty."
        ),
    )


class OptimizerConfig(_Strict):
    """Optimiser and learning-rate schedule."""

    name: Literal["sgd", "adamw", "muon"] = Field(
        "sgd",
        description=(
            "name is the optimiser: sgd, adamw or muon. muon trains convolution filters with Muon (the "
            "momentum orthogonalized by Newton-Schulz iteration, each filter bank kept at a fixed norm) "
            "at filter_lr, and every other parameter with sgd at lr; it needs a model whose convolutions "
            "all feed batch norm (whitened_cnn, resnet_small, resnet18). Default sgd."
        ),
    )
    lr: float = Field(0.01, gt=0, description="lr is the peak learning rate. Default 0.01.")
    filter_lr: float = Field(
        0.1,
        gt=0,
        description=(
            "filter_lr is muon's peak learning rate for convolution filters, following the same schedule "
            "as lr: the share of a filter bank's norm one step moves it. Default 0.1."
        ),
    )
    momentum: float = Field(0.9, ge=0, lt=1, description="momentum for sgd and muon. Default 0.9.")
    nesterov: bool = Field(
        False, description="nesterov enables Nesterov momentum for sgd and muon. Default false."
    )
    weight_decay: float = Field(0.0, ge=0, description="weight_decay is the L2 penalty. Default 0.")
    schedule: Literal["constant", "onecycle", "cosine"] = Field(
        "constant",
        description=(
            "schedule shapes the learning rate over training: constant, onecycle (linear up over the warmup, "
            "linear down to 0) or cosine (decay to 0 after the warmup). Default constant."
        ),
    )
    warmup_epochs: float = Field(
        0.0, ge=0, description="warmup_epochs ramps the learning rate linearly from 0 over this many epochs."
    )
    label_smoothing: float = Field(
        0.0, ge=0, lt=1, description="label_smoothing for the cross-entropy loss. Default 0."
    )
    lookahead: bool = Field(
        False,
        description=(
            "lookahead keeps a moving average of the weights and batch-norm statistics, every 5 steps moves "
            "it towards the network and resets the network to it, with an averaging strength growing over "
            "the run; the final model is the average. Damps the noise of high learning rates in short "
            "schedules. Default false."
        ),
    )


class TrainerConfig(_Strict):
    """Everything `kubetrain train` needs; defaults reproduce the tutorial baseline (SimpleCNN, SGD)."""

    model: Literal["simple_cnn", "resnet_small", "whitened_cnn", "resnet18"] = Field(
        "simple_cnn",
        description=(
            "model is the network: simple_cnn (the tutorial CNN), resnet_small (a narrow residual network "
            "with batch norm, fast on small images), whitened_cnn (the CIFAR-10 speed-run design: a frozen "
            "patch-whitening first layer fitted to the training images, three conv groups; fastest to a "
            "given accuracy on few cores) or resnet18 (torchvision ResNet-18 adapted to 32x32). "
            "Default simple_cnn."
        ),
    )
    width: int = Field(
        32,
        ge=8,
        le=512,
        description=(
            "width is the channel count of the first stage of resnet_small and whitened_cnn (the next two "
            "use 2x and 4x); other models ignore it. Default 32."
        ),
    )
    identity_init: bool = Field(
        False,
        description=(
            "identity_init starts each of whitened_cnn's 3x3 convolutions with its first filters passing "
            "their input channels through unchanged (the rest keep their random initialisation), as the "
            "CIFAR-10 speed runs do: the untrained network already carries the whitened image to its "
            "head. Only for model whitened_cnn. Default false."
        ),
    )
    epochs: float = Field(
        10,
        gt=0,
        le=10000,
        description=(
            "epochs is the number of passes over the data; a fraction ends the last pass early (1.5: one "
            "pass and half of the next) and the learning-rate schedule is sized to it. Default 10."
        ),
    )
    batch_size: int = Field(
        64,
        ge=1,
        le=65536,
        description=(
            "batch_size is the per-process batch size in images; the global batch is batch_size x "
            "WORLD_SIZE. Default 64."
        ),
    )
    seed: int = Field(
        0,
        ge=0,
        le=2**32 - 1,
        description=(
            "seed makes data order, augmentation and initialisation reproducible; 0 to 4294967295 (the "
            "per-epoch generator seeds derived from it must stay within 64 bits). Default 0."
        ),
    )
    augment: bool = Field(
        False,
        description=(
            "augment applies random crops (of the image reflect-padded by crop_padding) and horizontal "
            "flips to training batches. Default false."
        ),
    )
    crop_padding: int = Field(
        4,
        ge=0,
        le=16,
        description=(
            "crop_padding is how far, in pixels, augment's random crops shift the image; short runs learn "
            "faster with 2. Default 4."
        ),
    )
    flip: Literal["random", "alternating"] = Field(
        "random",
        description=(
            "flip is how augment mirrors images: random (each image with probability 1/2 every epoch) or "
            "alternating (each image in every other epoch from a seeded start, so any two consecutive epochs "
            "show both orientations). Default random."
        ),
    )
    data: DataConfig = Field(default_factory=DataConfig, description="data selects and splits the dataset.")
    optimizer: OptimizerConfig = Field(
        default_factory=OptimizerConfig,
        description="optimizer sets the optimiser and learning-rate schedule.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="device is where training runs; auto picks cuda when a GPU is visible. Default auto.",
    )
    precision: Precision = Field(
        "auto",
        description=(
            "precision is the type convolutions and matrix products run in: bf16 autocast (batch-norm "
            "statistics, loss and optimiser stay fp32) or fp32. auto is bf16 on a GPU with bf16 units "
            "(compute capability 8.0 and later: A100, H100) and fp32 on older GPUs (V100, T4) and on CPU. "
            "Set bf16 on CPUs with AMX (Intel Sapphire Rapids and later: 2-3x faster training) or "
            "AVX512-BF16 (AMD Zen 4 and later: 1.5x); on CPUs with neither bf16 is slower than fp32. "
            "Default auto."
        ),
    )
    compile: bool = Field(
        False,
        description=(
            "compile wraps the model in torch.compile, which pays a compilation (about 30 s) at start-up. "
            "On a CPU it slowed the budget recipe's training step to 0.82x eager's images/s (2-core AMD "
            "Zen 4, bf16). Default false."
        ),
    )
    output_dir: str = Field(
        "/output",
        description=(
            "output_dir is where artifacts and checkpoints go; the trainer writes under "
            "`<output_dir>/<job name>/` so jobs sharing a volume do not collide. Default /output."
        ),
    )
    checkpoint_every_epochs: int = Field(
        1,
        ge=1,
        description=(
            "checkpoint_every_epochs is the checkpoint interval in epochs; the last epoch always ends with "
            "one. Default 1."
        ),
    )
    checkpoint_every_seconds: int = Field(
        300,
        ge=0,
        description=(
            "checkpoint_every_seconds also checkpoints in the middle of an epoch once this many seconds "
            "passed since the last checkpoint (rank 0's clock, checked every 20 steps), so a failure loses "
            "at most about this much training however long an epoch is; 0 disables it. Default 300: the "
            "write runs in the background, so a few minutes cost little and bound the loss well below "
            "one epoch of a large data set."
        ),
    )
    checkpoint_every_steps: int = Field(
        0,
        ge=0,
        description=(
            "checkpoint_every_steps also checkpoints after every this many optimizer steps, counted over "
            "the whole run; 0 disables it. Default 0."
        ),
    )
    keep_checkpoints: int = Field(
        2, ge=1, description="keep_checkpoints is how many of the newest checkpoints are kept. Default 2."
    )
    rendezvous_timeout_seconds: int = Field(
        300,
        ge=1,
        description=(
            "rendezvous_timeout_seconds is how long a worker retries reaching the master before it exits "
            "with code 10 (retryable). Default 300."
        ),
    )

    eval_flip_tta: bool = Field(
        False,
        description=(
            "eval_flip_tta averages each validation prediction over the image and its mirror image "
            "(test-time augmentation: twice the evaluation cost, usually higher accuracy). Default false."
        ),
    )
    eval_translate_tta: bool = Field(
        False,
        description=(
            "eval_translate_tta adds validation views shifted one pixel diagonally each way (mirrored too "
            "when eval_flip_tta is set), weighted half as much as the unshifted ones. Default false."
        ),
    )
    cpu_threads: int = Field(
        0,
        ge=0,
        description=(
            "cpu_threads is the number of intra-op threads per process on CPU; 0 divides the CPUs the worker "
            "may use evenly among its LOCAL_WORLD_SIZE processes: its CPU limit (resources.limits.cpu, "
            "rounded up) when that is below its visible cores, else those cores (a CPU request alone sets no "
            "limit). Default 0."
        ),
    )
    log_every_steps: int = Field(
        50,
        ge=1,
        description="log_every_steps is the interval in steps between progress log lines. Default 50.",
    )
    collective_timeout_seconds: int = Field(
        1800,
        ge=1,
        description=(
            "collective_timeout_seconds bounds how long a rank waits in one collective for its peers before "
            "it exits with code 11 (retryable). Default 1800."
        ),
    )

    @model_validator(mode="after")
    def _check_model_fits_images(self) -> TrainerConfig:
        if self.model == "simple_cnn" and self.data.image_size != 32:
            raise ValueError(
                "model simple_cnn needs data.image_size 32 (its fc1 takes 64x6x6=2304 inputs), "
                f"got {self.data.image_size}"
            )
        return self

    @model_validator(mode="after")
    def _check_identity_init_has_its_model(self) -> TrainerConfig:
        if self.identity_init and self.model != "whitened_cnn":
            raise ValueError(f"identity_init needs model whitened_cnn, got model {self.model}")
        return self

    @model_validator(mode="after")
    def _check_muon_filters_feed_batch_norm(self) -> TrainerConfig:
        if self.optimizer.name == "muon" and self.model not in MODELS_WITH_NORMALIZED_FILTERS:
            raise ValueError(
                f"optimizer.name muon needs a model whose convolutions all feed batch norm "
                f"({', '.join(MODELS_WITH_NORMALIZED_FILTERS)}): it fixes each filter bank's norm, which "
                f"changes what model {self.model} computes"
            )
        return self


RESUME_NEUTRAL_FIELDS = frozenset(
    {
        "epochs",
        "output_dir",
        "device",
        "compile",
        "precision",
        "checkpoint_every_epochs",
        "checkpoint_every_seconds",
        "checkpoint_every_steps",
        "keep_checkpoints",
        "rendezvous_timeout_seconds",
        "collective_timeout_seconds",
        "cpu_threads",
        "log_every_steps",
        "eval_flip_tta",
        "eval_translate_tta",
        "data.root",
        "data.cache_decoded",
        "data.cache",
        "data.cache_dir",
    }
)
"""Fields a resumed run may change: where and how it runs, not what the checkpointed state means.

`epochs` may grow (continue training) but not fall below the checkpoint's epoch; the resume checks that
separately. Every other field (model, width, seed, batch size, augmentation, optimiser, data selection)
shapes the weights or the optimiser state, so a checkpoint written under another value starts fresh.
"""


def resume_identity(config: TrainerConfig) -> dict[str, Any]:
    """The fields a checkpoint must share with this run to be resumed, as `{"data.image_size": 32, ...}`."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: dict[str, Any]) -> None:
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(f"{name}.", value)
            elif name not in RESUME_NEUTRAL_FIELDS:
                flat[name] = value

    walk("", config.model_dump(mode="json"))
    return flat
