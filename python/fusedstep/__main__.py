# SPDX-License-Identifier: Apache-2.0
"""python -m fusedstep: what this installation is and whether each visible GPU runs it
(build_info(), torch, and per device its compute capability or the error its first call
would raise). Exits 0 when every visible GPU is supported (or none is visible)."""
import json
import sys

import fusedstep
from fusedstep import _C


def main():
    info = dict(fusedstep.build_info())
    info["torch"] = None
    count = 0
    if fusedstep.has_torch:
        import torch
        info["torch"] = torch.__version__
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(json.dumps(info, indent=2))
    ok = True
    for device in range(count):
        try:
            d = _C.device_info(device)
            print(f"cuda:{device}: compute capability {d['cc_major']}.{d['cc_minor']}, "
                  f"{d['sm_count']} SMs: supported")
        except RuntimeError as e:
            ok = False
            print(f"cuda:{device}: {e}")
    if fusedstep.has_torch and count == 0:
        print("no CUDA device visible to torch")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
