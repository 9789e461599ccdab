#!/bin/bash
# Written by hpctorch submit: one task per node (mpiexec --ppn 1, as with Cray PALS or
# MPICH) runs `hpctorch run`, which starts $nproc worker(s) per node.
#PBS -N $job_name
#PBS -l select=$nodes:mpiprocs=1$pbs_resources
#PBS -l walltime=$time_hms
#PBS -j oe
#PBS -V
$directives
cd "$${PBS_O_WORKDIR:-.}"
mpiexec -n $nodes --ppn 1 $command
