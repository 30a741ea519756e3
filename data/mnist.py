"""MNIST: 60,000 training / 10,000 test 28x28 grey digits, as IDX files in torchvision's layout
(root/MNIST/raw/), read by data.idx."""

from data.idx import IdxDataset

MNIST = IdxDataset(name="mnist", torchvision_class="MNIST")
