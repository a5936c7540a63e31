#!/bin/sh
# Regenerate the catalogue example (docs/files.md): vgg16 estimated on the unit types of three AWS
# instances, a cluster of those instances built from the instance catalogue, and its exact plans.
#     sh profiles/make_aws_example.sh
set -eu
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for device in v100-16gb l4 cpu; do
    heterps profile vgg16 --estimate "$device" --as "$device" --batch-size 128 --out "$tmp/vgg16-$device.yaml" >/dev/null
done
(cd "$tmp" && heterps profile merge vgg16-v100-16gb.yaml vgg16-l4.yaml vgg16-cpu.yaml --out vgg16-aws.yaml >/dev/null)
cp "$tmp/vgg16-aws.yaml" profiles/vgg16-aws.yaml
heterps cluster p3.8xlarge=4 g6.24xlarge=4 c7i.24xlarge=8 --out clusters/aws-catalogue.yaml >/dev/null
heterps plan profiles/vgg16-aws.yaml clusters/aws-catalogue.yaml --scheduler exact --samples 1000000 \
    --global-batch 1024 --min-throughput 15000 --explain --out docs/plans/vgg16-aws.yaml >/dev/null
# The fastest plan on the same instances at micro-batch 128: five nodes of two kinds, the launch guide's example
heterps plan profiles/vgg16-aws.yaml clusters/aws-catalogue.yaml --scheduler exact --objective time --samples 1000000 \
    --global-batch 1024 --micro-batch 128 --explain --out docs/plans/vgg16-aws-fastest.yaml >/dev/null
