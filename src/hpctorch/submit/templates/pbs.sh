#!/bin/bash
# Written by hpctorch submit: $layout
#PBS -N $job_name
#PBS -l select=$nodes:mpiprocs=$tasks_per_node$pbs_resources
#PBS -l walltime=$time_hms
#PBS -j oe
#PBS -V
$directives
cd "$${PBS_O_WORKDIR:-.}"
mpiexec -n $total_tasks --ppn $tasks_per_node $command
