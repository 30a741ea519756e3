"""Kuzushiji-MNIST: 60,000 training / 10,000 test 28x28 grey cursive Japanese characters in 10
classes, as IDX files in torchvision's layout (root/KMNIST/raw/), read by data.idx."""

from data.idx import IdxDataset

KMNIST = IdxDataset(name="kmnist", torchvision_class="KMNIST")
