#!/bin/sh
# Last step of the node image build, run inside the bootstrapped rootfs (chroot).
set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
# The sources written from the host's configuration replace debootstrap's one-line list.
rm -f /etc/apt/sources.list
# Package lists ship with the image, so a task script can install without `apt-get update`.
apt-get update -q
apt-get clean
rm -rf /usr/share/doc/* /usr/share/man/* /usr/share/info/* /var/log/apt/* /var/log/*.log /var/cache/apt/*.bin
# Docker provides these per container.
: > /etc/resolv.conf
: > /etc/hostname
: > /etc/machine-id
