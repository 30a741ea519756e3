"""Fashion-MNIST (Zalando): 60,000 training / 10,000 test 28x28 grey images of clothes in 10
classes, as IDX files in torchvision's layout (root/FashionMNIST/raw/), read by data.idx."""

from data.idx import IdxDataset

FASHION_MNIST = IdxDataset(name="fashion_mnist", torchvision_class="FashionMNIST")
