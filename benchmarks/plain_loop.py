#!/usr/bin/env python3
"""The plain PyTorch training loop that `gpu_check.sh` times torchkit against.

What a user writes by hand from the PyTorch tutorials: torchvision's `ImageFolder` on ROOT/train
with RandomResizedCrop + RandomHorizontalFlip + ToTensor + Normalize (ImageNet statistics, as
torchkit's default), a `DataLoader` (shuffle, the same batch size and workers, pinned memory on
CUDA, persistent workers), a torchvision model with a 10-class head, AdamW, cross-entropy, and
optionally autocast (bf16 on CPUs and on GPUs that compute in it natively, else fp16 with a
GradScaler: torchkit's `--amp` rule) and channels-last. `cudnn.benchmark` is on, as in
torchkit's and timm's training. No validation pass: each epoch's training pass is timed (from
asking the loader for the first batch to the last step, CUDA synchronised), as torchkit's
`epoch_time_s` times its own.

    python benchmarks/plain_loop.py ROOT --model resnet18 --image-size 224 -b 256 -j 14 \\
        --epochs 3 --amp --channels-last --device cuda [-o rates.json]

Prints one line per epoch (seconds and images/s); `-o` writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="a folder with train/<class>/<image>")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("-j", "--workers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", type=Path, help="write the per-epoch figures as JSON")
    args = parser.parse_args()

    import torch
    import torchvision
    from torchvision import transforms

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.backends.cudnn.benchmark = True

    transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(args.image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    dataset = torchvision.datasets.ImageFolder(str(args.root / "train"), transform=transform)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=cuda,
        persistent_workers=args.workers > 0,
    )

    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = torchvision.models.get_model(args.model, num_classes=len(dataset.classes))
    model = model.to(device, memory_format=memory_format)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    criterion = torch.nn.CrossEntropyLoss()

    dtype = torch.bfloat16
    if args.amp and cuda and not torch.cuda.is_bf16_supported(including_emulation=False):
        dtype = torch.float16
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp and dtype == torch.float16)

    rows = []
    model.train()
    for epoch in range(1, args.epochs + 1):
        seen = 0
        start = time.perf_counter()
        for images, labels in loader:
            images = images.to(device, non_blocking=True, memory_format=memory_format)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=dtype, enabled=args.amp):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            seen += images.shape[0]
        if cuda:
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        row = {
            "epoch": epoch,
            "epoch_time_s": seconds,
            "images_per_s": seen / seconds,
            "loss": loss.item(),
        }
        rows.append(row)
        print(
            f"epoch {epoch}: {seconds:.2f} s, {row['images_per_s']:.1f} images/s, "
            f"last loss {row['loss']:.3f}",
            flush=True,
        )
    if args.output is not None:
        args.output.write_text(json.dumps({"model": args.model, "epochs": rows}, indent=1))


if __name__ == "__main__":
    main()
