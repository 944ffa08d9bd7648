"""What meta.json records of the CPU a run ran on, read from /proc/cpuinfo's text as each kind of kernel writes it."""

from __future__ import annotations

X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
stepping\t: 1
microcode\t: 0x1000065
cache size\t: 512 KB

processor\t: 1
model\t\t: 17
model name\t: AMD EPYC 9654
"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 243.75
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd40
CPU revision\t: 1
"""
OLD_ARM_CPUINFO = """processor\t: 0
model name\t: ARMv7 Processor rev 3 (v7l)
BogoMIPS\t: 108.00

processor\t: 1
model name\t: ARMv7 Processor rev 3 (v7l)

Hardware\t: BCM2835
CPU implementer\t: 0x41
CPU architecture: 7
CPU variant\t: 0x0
CPU part\t: 0xc07
CPU revision\t: 3
"""


def test_the_cpu_is_told_apart_beyond_its_model_name_by_the_first_block_that_says():
    from kvpages.measure.environment import cpu_id, cpu_model

    assert cpu_model(X86_CPUINFO) == "AMD EPYC"
    assert cpu_id(X86_CPUINFO, "32768K") == ("vendor AuthenticAMD family 25 model 1 stepping 1 microcode 0x1000065, "
                                             "L3 32768K")
    assert cpu_id(ARM_CPUINFO, "") == "implementer 0x41 part 0xd40 variant 0x1 revision 1"
    assert cpu_id(OLD_ARM_CPUINFO, "") == "implementer 0x41 part 0xc07 variant 0x0 revision 3"  # written once, after
    assert cpu_model(OLD_ARM_CPUINFO) == "ARMv7 Processor rev 3 (v7l)"
    assert cpu_id("", "") is None and cpu_id("", "1024K") == "L3 1024K"
