"""Stage 5, verify: check a release on the device it will serve on, store the evidence, render it
for a reviewer, and rehearse rollbacks.

    verify    correctness (NaN poisoning) and timing of every specialization vs its reference, into the evidence
    spec_check  one specialization checked and timed against its reference (verify_spec, VerifyOptions)
    report    HTML page and plots (report_plots) of a release's evidence
    drill     rollback rehearsal against a running ``tileship serve``
    demo      call every specialization this machine can run and compare with the reference
"""
